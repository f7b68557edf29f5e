"""Which of the kernel's parts dictionary training and grading may touch: the calibration's and
the explaining's (a training chains them), and the store. The composition root hands the kernel's
whole state, and mypy checks there that it has these; a function here can reach no other part."""

from __future__ import annotations

from typing import Protocol

from millm.kernel.parts import HasStore
from millm.lab.calibration.parts import CalibrationParts
from millm.lab.labels.parts import LabelParts


class DictionaryParts(CalibrationParts, LabelParts, HasStore, Protocol):
    """The kernel's parts, as dictionary training and grading reach them."""
