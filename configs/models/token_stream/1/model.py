"""Streams the words of its input back one response at a time, the way a token generator would."""

import numpy as np


class Model:
    def initialize(self, config):
        pass

    def execute(self, inputs):
        text = inputs["TEXT"][0]
        for word in bytes(text).split():
            yield {"TOKEN": np.array([word], dtype=object)}
