"""``autoplan calibrate``: the job's own devices and links, measured into a topology.

Pipeline position: beside the planner; its output, a topology YAML (or a
:class:`~autoplan.core.topology.Topology`), is the cost model's input. Read in order:

- :mod:`~autoplan.calibrate.settings`: what is measured (sizes, shapes, repeats);
- :mod:`~autoplan.calibrate.groups`: the process groups (each axis, runs of axes);
- :mod:`~autoplan.calibrate.timing`: every rank at once, the slowest rank, the median;
- :mod:`~autoplan.calibrate.comm` and :mod:`~autoplan.calibrate.compute`: the measuring;
- :mod:`~autoplan.calibrate.fit_links` and :mod:`~autoplan.calibrate.fit_device`: the fits;
- :mod:`~autoplan.calibrate.header` and :mod:`~autoplan.calibrate.write`: the YAML file and
  the comment heading it;
- :mod:`~autoplan.calibrate.run`: :func:`calibrate`, the whole;
- :mod:`~autoplan.calibrate.command`: the ``autoplan calibrate`` command under torchrun.

docs/calibrate.md explains the model and how to read the fits' errors.

May import: every folder below it, the runtime's buffer release among them; never the tools.
"""

from autoplan.calibrate.run import calibrate
from autoplan.calibrate.settings import Settings

__all__ = ["Settings", "calibrate"]
