"""add_sub_triton: a model.py in the shape of Triton's Python backend; zinfer runs it unchanged."""

import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        # args: model_config (a JSON string), model_instance_kind, model_instance_device_id,
        # model_name, model_version, model_repository; every value a string, as in Triton.
        self.model_config = json.loads(args["model_config"])
        sum_config = pb_utils.get_output_config_by_name(self.model_config, "OUTPUT0")
        diff_config = pb_utils.get_output_config_by_name(self.model_config, "OUTPUT1")
        self.sum_dtype = pb_utils.triton_string_to_numpy(sum_config["data_type"])
        self.diff_dtype = pb_utils.triton_string_to_numpy(diff_config["data_type"])
        print(f"{args['model_name']}: initialized on {args['model_instance_kind']}")

    def execute(self, requests):
        # One response per request, in order; each request keeps its own rows of the batch.
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            print(f"add_sub_triton: request {request.request_id()!r} with {a.shape[0]} row(s)")
            out_sum = pb_utils.Tensor("OUTPUT0", (a + b).astype(self.sum_dtype))
            out_diff = pb_utils.Tensor("OUTPUT1", (a - b).astype(self.diff_dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out_sum, out_diff]))
        return responses

    def finalize(self):
        print("add_sub_triton: cleaning up")
