"""A Triton-style model that calls other models (BLS): short inputs go to "identity", long ones to "double"."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.threshold = int(config["parameters"]["threshold"]["string_value"])

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if x.size <= self.threshold:
                call = pb_utils.InferenceRequest(
                    model_name="identity", requested_output_names=["OUTPUT0"],
                    inputs=[pb_utils.Tensor("INPUT0", x[None].astype(np.float32))],
                )
                name = "OUTPUT0"
            else:
                call = pb_utils.InferenceRequest(
                    model_name="double", requested_output_names=["SUM"],
                    inputs=[pb_utils.Tensor("A", x[None]), pb_utils.Tensor("B", x[None])],
                )
                name = "SUM"
            answer = call.exec()
            if answer.has_error():  # errors come back as values, as in Triton
                responses.append(pb_utils.InferenceResponse(error=answer.error()))
                continue
            y = pb_utils.get_output_tensor_by_name(answer, name).as_numpy()[0]
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("Y", y)]))
        return responses
