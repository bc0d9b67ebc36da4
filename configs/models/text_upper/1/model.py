"""text_upper: a native zinfer Python model.

``execute`` gets the whole dynamic batch at once: ``inputs["TEXT"]`` is a NumPy object array of bytes
with shape [batch, 1], and it returns every output for the whole batch, by name.
"""

import numpy as np


class Model:
    def initialize(self, config):
        # config: this model's config.pbtxt as Triton's JSON dict, plus device, device_kind, device_id,
        # model_version and version_dir (where files next to model.py live).
        self.name = config["name"]

    def execute(self, inputs):
        text = inputs["TEXT"]
        words = [t.decode("utf-8", "replace") for t in text.reshape(-1)]
        upper = np.empty(len(words), dtype=object)
        upper[:] = [w.upper().encode("utf-8") for w in words]
        tokens = np.array([len(w.split()) for w in words], dtype=np.int32)
        return {"UPPER": upper.reshape(text.shape), "TOKENS": tokens.reshape(text.shape)}

    def finalize(self):
        pass
