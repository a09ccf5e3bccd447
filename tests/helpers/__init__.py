"""Helpers shared by several test files; a test file imports from here, never from another test.

- ``paths``: ``REPO`` and ``CONFIGS``, the checkout's folders, whatever a test's depth.
- ``brute_force``: every plan of a small cost table or ILP problem, and the cheapest.
- ``ilp_problems``: random cost tables and ILP problems, stacks of identical layers.
- ``runs``: run-file texts the CLI tests plan, and one planned and saved.
- ``planning``: a slow device topology; planning a model built on the meta device, the
  tiny MLP and the tiny LLaMA.
- ``priced``: the tiny LLaMA traced, its strategies and prices, for tests that build the ILP.
- ``tracing``: the joint forward+backward graph of a step, traced by make_fx.
- ``execution``: a tensor placed as a DTensor with any placements, Partial included.
- ``gloo``: running a function on several gloo processes (``mp.spawn``).
- ``bad_input``: the CLI run in process, and checks that an error is clear.
- ``isolated``: a snippet run in a fresh interpreter, its printed JSON returned.
- ``apply_plans``, ``checkpointing``, ``frozen_models``, ``memory_plans``: the models and
  plans a unit test and its integration counterpart share.
- ``edge_checks``: an edge's price matrix compared pair by pair with per-pair prices.
- ``readme``: the README's text and its ``autoplan`` command lines.
"""
