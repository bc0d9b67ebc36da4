"""detokenizer: tokens back to bytes (token - 1), padding (0) dropped."""

import numpy as np


class Model:
    def initialize(self, config):
        pass

    def execute(self, inputs):
        tokens = np.asarray(inputs["TOKENS"])
        if tokens.size and (tokens.min() < 0 or tokens.max() > 256):
            raise ValueError("tokens must lie in [0, 256]")
        text = np.empty((tokens.shape[0], 1), dtype=object)
        for row in range(tokens.shape[0]):
            kept = tokens[row][tokens[row] > 0]
            text[row, 0] = (kept - 1).astype(np.uint8).tobytes()
        return {"TEXT": text}
