"""Which of the kernel's parts dictionary training and grading may touch: the calibration's and
the explaining's (a training chains them), the store, and the transcoder book (a trained set is
registered there). The composition root hands the kernel's
whole state, and mypy checks there that it has these; a function here can reach no other part."""

from __future__ import annotations

from typing import Protocol

from millm.kernel.parts import HasStore, HasTranscoders
from millm.lab.calibration.parts import CalibrationParts
from millm.lab.labels.parts import LabelParts


class DictionaryParts(CalibrationParts, LabelParts, HasStore, HasTranscoders, Protocol):
    """The kernel's parts, as dictionary training and grading reach them."""
