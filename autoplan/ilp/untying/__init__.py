"""Stage 5d, untying: let the copies of a repeated layer differ where a memory budget pays.

Input: the node-level cost table, the tied model and its relaxation. Output: an untied
plan never dearer than the tied incumbent. Order: :mod:`.mix` mixes the LP's strategies
layer by layer, then :mod:`.untie` solves an untied ILP near the LP's plan. Why: tying
gives every copy one strategy, and under a binding budget the best plan may not.
"""
