"""tokenizer: each byte of the text becomes one token (byte + 1); 0 pads a batch's shorter rows."""

import numpy as np


class Model:
    def initialize(self, config):
        pass

    def execute(self, inputs):
        texts = [bytes(t) for t in inputs["TEXT"].reshape(-1)]
        longest = max((len(t) for t in texts), default=0)
        tokens = np.zeros((len(texts), max(longest, 1)), np.int32)
        for row, text in enumerate(texts):
            tokens[row, : len(text)] = np.frombuffer(text, np.uint8).astype(np.int32) + 1
        return {"TOKENS": tokens}
