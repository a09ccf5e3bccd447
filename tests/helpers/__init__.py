"""Helpers shared by several test files; a test file imports from here, never from another test.

- ``brute_force``: every plan of a small cost table or ILP problem, and the cheapest.
- ``ilp_problems``: random cost tables and ILP problems, stacks of identical layers.
- ``runs``: run-file texts the CLI tests plan.
- ``planning``: a slow device topology; planning a model built on the meta device, the
  tiny MLP and the tiny LLaMA.
- ``tracing``: the joint forward+backward graph of a step, traced by make_fx.
- ``execution``: a tensor placed as a DTensor with any placements, Partial included.
- ``gloo``: running a function on several gloo processes (``mp.spawn``).
- ``bad_input``: the CLI run in process, and checks that an error is clear.
- ``isolated``: a snippet run in a fresh interpreter, its printed JSON returned.
"""
