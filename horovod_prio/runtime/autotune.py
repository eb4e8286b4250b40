"""Online tuning of the scheduler's credit from measured step times. No TensorFlow.

In the spirit of Horovod's ``HOROVOD_AUTOTUNE``: a few settings are tried
during the first steps, the best (lowest median step time) is kept, and the
exploration starts again when the step time drifts away from what the kept
setting measured. Only rank 0 holds chunks, so the credit is rank 0's own
setting: the other ranks never hold and need not agree on it, no collective
is involved, and a change between two steps (or inside one) can neither
deadlock nor reorder a chunk already released - it only changes how many
waiting chunks may go.

:class:`CreditTuner` is pure (it is fed step times and returns decisions), so
it is tested on synthetic cost functions; the runtime applies its decisions
to the scheduler and logs them (logger ``horovod_prio`` and the trace).
"""
import statistics

__all__ = ["CreditTuner", "credit_candidates"]


def credit_candidates(step_bytes, unlimited):
    """The settings tried: no limit, then one step's gradient bytes cut in 2, 4, 8."""
    out = [unlimited]
    for div in (2, 4, 8):
        c = max(1024, step_bytes // div)
        if c not in out:
            out.append(c)
    return out


class CreditTuner:
    """Explore ``candidates`` (``steps_per_trial`` measured steps each, the first
    ``discard`` of a trial dropped: a change takes effect mid-step), keep the
    fastest, and re-explore when the median of the last ``window`` steps
    differs from the kept setting's by more than ``drift`` (relative).

    :meth:`on_step` returns the credit to apply now, or ``None`` (no change).
    ``choices`` records every decision (for logs and tests).
    """

    def __init__(self, candidates, steps_per_trial=8, discard=2, drift=0.2, window=20):
        if not candidates:
            raise ValueError("candidates must not be empty")
        if steps_per_trial <= discard:
            raise ValueError("steps_per_trial must be > discard, got %r <= %r"
                             % (steps_per_trial, discard))
        self.candidates = list(candidates)
        self.steps_per_trial = int(steps_per_trial)
        self.discard = int(discard)
        self.drift = float(drift)
        self.window = int(window)
        self.choices = []          # (step, credit, why)
        self.best = None
        self._baseline = None
        self._recent = []
        self._step = 0
        self._start_exploring("start")

    @property
    def exploring(self):
        return self._trial is not None

    @property
    def current(self):
        return self._current

    def _start_exploring(self, why):
        self._trial = 0
        self._samples = []
        self._results = []
        self._current = self.candidates[0]
        self.choices.append((self._step, self._current, "try (%s)" % why))

    def start_value(self):
        """The credit to configure before the first step."""
        return self._current

    def on_step(self, seconds):
        self._step += 1
        if self._trial is not None:
            self._samples.append(seconds)
            if len(self._samples) < self.steps_per_trial:
                return None
            self._results.append(statistics.median(self._samples[self.discard:]))
            self._samples = []
            self._trial += 1
            if self._trial < len(self.candidates):
                self._current = self.candidates[self._trial]
                self.choices.append((self._step, self._current, "try"))
                return self._current
            i = min(range(len(self._results)), key=lambda k: (self._results[k], k))
            self.best = self._current = self.candidates[i]
            self._baseline = self._results[i]
            self._trial = None
            self._recent = []
            self.choices.append((self._step, self._current, "keep: median %.4fs (tried %s)" % (
                self._baseline, ", ".join("%.4f" % r for r in self._results))))
            return self._current
        self._recent.append(seconds)
        if len(self._recent) > self.window:
            self._recent.pop(0)
        if len(self._recent) == self.window:
            m = statistics.median(self._recent)
            if abs(m - self._baseline) > self.drift * self._baseline:
                self._start_exploring("step time drifted from %.4fs to %.4fs"
                                      % (self._baseline, m))
                return self._current
        return None
