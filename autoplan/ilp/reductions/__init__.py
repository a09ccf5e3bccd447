"""Stage 5a, reductions: make the ILP smaller before it is written.

Input: a :class:`~autoplan.cost.price.CostTable`. Output: a smaller cost table with the
map back to every merged node (:mod:`.followers`), and a tie map under which the copies
of a repeated layer share variables (:mod:`.tying`). Why: a transformer graph's ILP is
mostly followers and repeated layers; these reductions shrink it to about one layer.
"""
