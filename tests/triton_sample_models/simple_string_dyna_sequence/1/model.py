"""Sums INPUT over a sequence (START resets the sum); the END response also adds the correlation ID, a
string read as an integer."""

import numpy as np
import triton_python_backend_utils as pb_utils


def _flag(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return tensor is not None and bool(tensor.as_numpy().reshape(-1)[0])


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            corrid = pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy().reshape(-1)[0]
            key = corrid.decode() if isinstance(corrid, bytes) else str(corrid)
            value = int(pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().reshape(-1)[0])
            total = value if _flag(request, "START") else self.sums.get(key, 0) + value
            self.sums[key] = total
            out = total
            if _flag(request, "END"):
                del self.sums[key]
                out += int(key)
            output = pb_utils.Tensor("OUTPUT", np.array([[out]], dtype=np.int32))
            responses.append(pb_utils.InferenceResponse([output]))
        return responses
