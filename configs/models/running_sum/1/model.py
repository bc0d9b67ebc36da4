"""The running sum of X per sequence: START resets it, CORRID names the sequence (one row each)."""

import numpy as np


class Model:
    def initialize(self, config):
        self.sums = {}

    def execute(self, inputs):
        x = np.asarray(inputs["X"], np.float32).reshape(-1)
        start = np.asarray(inputs["START"]).reshape(-1)
        corrid = np.asarray(inputs["CORRID"]).reshape(-1)
        out = np.empty((len(x), 1), np.float32)
        for row, (value, first, sid) in enumerate(zip(x, start, corrid, strict=True)):
            total = (0.0 if first else self.sums.get(int(sid), 0.0)) + float(value)
            self.sums[int(sid)] = total
            out[row, 0] = total
        return {"SUM": out}

    def finalize(self):
        self.sums.clear()
