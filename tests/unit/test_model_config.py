"""Model configs: every block of the config surface, Triton's defaults, strict errors, JSON form, features."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from zinfer.client.errors import ConfigError
from zinfer.modelconfig.instances import InstanceKind
from zinfer.modelconfig.model_config import (
    ModelConfig,
    load_model_config,
    parse_model_config,
    unsupported_features,
)
from zinfer.modelconfig.optimization import ModelPriority
from zinfer.modelconfig.scheduling import QueuePolicy, TimeoutAction
from zinfer.modelconfig.sequence_batching import ControlKind, SequenceDirect
from zinfer.modelconfig.tensors import BatchInputKind, InputFormat
from zinfer.modelconfig.version_policy import VersionPolicy

SRC = "models/add/config.pbtxt"

IO = """
input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def cfg(text: str, name: str = "add") -> ModelConfig:
    return parse_model_config(text, source=SRC, model_name=name)


def err(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        cfg(text)
    return str(info.value)


# ----------------------------------------------------------------------------------------- valid configs


def test_minimal_config_gets_triton_defaults() -> None:
    c = cfg(IO)
    assert c.name == "add"
    assert c.platform == c.backend == ""
    assert c.max_batch_size == 0
    assert c.version_policy == VersionPolicy("latest", 1)
    assert c.dynamic_batching is None and c.sequence_batching is None and c.ensemble_scheduling is None
    assert len(c.instance_group) == 1
    group = c.instance_group[0]
    assert (group.name, group.kind, group.count, group.gpus) == ("add", InstanceKind.KIND_AUTO, 1, ())
    assert c.optimization.input_pinned_memory and c.optimization.output_pinned_memory
    assert dict(c.parameters) == {} and dict(c.metric_tags) == {}
    assert not c.decoupled and not c.response_cache.enable
    assert unsupported_features(c) == []


def test_inputs_and_outputs() -> None:
    c = cfg(
        """
        name: "add"
        backend: "zinfer"
        max_batch_size: 8
        input [
          { name: "IMAGE" data_type: TYPE_UINT8 format: FORMAT_NHWC dims: [ 224, 224, 3 ] },
          { name: "TEXT", data_type: TYPE_STRING, dims: [ -1 ], allow_ragged_batch: true, optional: true },
          { name: "SCALAR" data_type: TYPE_INT64 dims: [ 1 ] reshape: { shape: [ ] } is_shape_tensor: false }
        ]
        output {
          name: "PROB"
          data_type: TYPE_FP32
          dims: [ 1000 ]
          reshape { shape: [ 10, 100 ] }
          label_filename: "labels.txt"
        }
        output { name: "RAW" data_type: TYPE_BF16 dims: [ -1, 2 ] is_non_linear_format_io: true }
        """
    )
    image, text, scalar = c.input
    assert image.format is InputFormat.FORMAT_NHWC and image.dims == (224, 224, 3)
    assert text.allow_ragged_batch and text.optional and text.data_type == "TYPE_STRING"
    assert scalar.reshape == ()
    prob, raw = c.output
    assert prob.reshape == (10, 100) and prob.label_filename == "labels.txt"
    assert raw.is_non_linear_format_io
    assert c.input_named("TEXT") is text and c.output_named("RAW") is raw and c.input_named("nope") is None


def test_tensor_helpers() -> None:
    c = cfg(
        """
        max_batch_size: 4
        input [ { name: "A" data_type: TYPE_FP16 dims: [ 2, 3 ] },
                { name: "V" data_type: TYPE_INT32 dims: [ -1 ] },
                { name: "S" data_type: TYPE_STRING dims: [ 1 ] } ]
        """
    )
    a, v, s = c.input
    assert a.wire_dtype == "FP16" and s.wire_dtype == "BYTES"
    assert a.full_shape(4) == (-1, 2, 3) and a.full_shape(0) == (2, 3)
    assert a.is_fixed_size and not v.is_fixed_size and not s.is_fixed_size


def test_version_policies() -> None:
    assert cfg("version_policy: { latest: { num_versions: 2 } }").version_policy == VersionPolicy("latest", 2)
    assert cfg("version_policy { latest { } }").version_policy == VersionPolicy("latest", 1)
    assert cfg("version_policy: { all: { } }").version_policy.kind == "all"
    specific = cfg("version_policy: { specific: { versions: [ 3, 1, 3 ] } }").version_policy
    assert specific.kind == "specific" and specific.versions == (1, 3)
    assert cfg("version_policy { }").version_policy == VersionPolicy()


def test_dynamic_batching_full() -> None:
    c = cfg(
        """
        max_batch_size: 16
        dynamic_batching {
          preferred_batch_size: [ 4, 8 ]
          max_queue_delay_microseconds: 100
          preserve_ordering: true
          priority_levels: 3
          default_priority_level: 2
          default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 5000
                                 allow_timeout_override: true max_queue_size: 10 }
          priority_queue_policy { key: 1 value: { max_queue_size: 2 } }
          priority_queue_policy { key: 3 value { timeout_action: REJECT } }
        }
        """
    )
    db = c.dynamic_batching
    assert db is not None
    assert db.preferred_batch_size == (4, 8) and db.max_queue_delay_microseconds == 100
    assert db.preserve_ordering and db.priority_levels == 3 and db.default_priority_level == 2
    assert db.default_queue_policy == QueuePolicy(TimeoutAction.DELAY, 5000, True, 10)
    assert dict(db.priority_queue_policy) == {1: QueuePolicy(max_queue_size=2), 3: QueuePolicy()}
    assert db.zinfer_latency_target_microseconds == 0


def test_zinfer_latency_target() -> None:
    c = cfg("max_batch_size: 8 dynamic_batching { zinfer_latency_target_microseconds: 5000 }")
    assert c.dynamic_batching is not None and c.dynamic_batching.zinfer_latency_target_microseconds == 5000
    d = c.to_dict()["dynamic_batching"]
    assert d["zinfer_latency_target_microseconds"] == 5000 and d["preferred_batch_size"] == [8]
    assert json.loads(json.dumps(d)) == d
    plain = cfg("max_batch_size: 8 dynamic_batching { max_queue_delay_microseconds: 7 }").to_dict()
    assert "zinfer_latency_target_microseconds" not in plain["dynamic_batching"]  # Triton's form when unset
    assert plain["dynamic_batching"]["max_queue_delay_microseconds"] == 7
    assert unsupported_features(c) == []


def test_preferred_batch_size_normalisation() -> None:
    db = cfg("max_batch_size: 8 dynamic_batching { }").dynamic_batching
    assert db is not None and db.preferred_batch_size == (8,)
    db0 = cfg("max_batch_size: 0 dynamic_batching { }").dynamic_batching
    assert db0 is not None and db0.preferred_batch_size == ()


def test_sequence_batching_direct_with_controls_and_state() -> None:
    c = cfg(
        """
        max_batch_size: 2
        sequence_batching {
          max_sequence_idle_microseconds: 5000000
          direct { max_queue_delay_microseconds: 100, minimum_slot_utilization: 0.5 }
          control_input [
            { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
            { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
            { name: "END" control [ { kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] } ] },
            { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
          ]
          state [ {
            input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [ -1 ]
            initial_state: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zeros" }
            use_same_buffer_for_input_output: true
          } ]
          iterative_sequence: false
        }
        """
    )
    sb = c.sequence_batching
    assert sb is not None
    assert sb.max_sequence_idle_microseconds == 5_000_000
    assert sb.direct == SequenceDirect(100, 0.5) and sb.oldest is None
    kinds = [ci.control[0].kind for ci in sb.control_input]
    assert kinds == list(ControlKind)
    assert sb.control_input[0].control[0].fp32_false_true == (0.0, 1.0)
    assert sb.control_input[2].control[0].bool_false_true == (False, True)
    state = sb.state[0]
    assert state.initial_state[0].zero_data and state.use_same_buffer_for_input_output
    assert "sequence_batching.state" not in unsupported_features(c)  # implicit state is supported


def test_sequence_batching_defaults_and_oldest() -> None:
    sb = cfg("max_batch_size: 4 sequence_batching { }").sequence_batching
    assert sb is not None and sb.max_sequence_idle_microseconds == 1_000_000 and sb.direct == SequenceDirect()
    sb = cfg(
        "max_batch_size: 4 sequence_batching { max_sequence_idle_microseconds: 0 "
        "oldest { max_candidate_sequences: 4 max_queue_delay_microseconds: 10 } }"
    ).sequence_batching
    assert sb is not None and sb.direct is None and sb.oldest is not None
    assert sb.max_sequence_idle_microseconds == 1_000_000
    assert sb.oldest.preferred_batch_size == (4,) and sb.oldest.max_candidate_sequences == 4


def test_ensemble_scheduling() -> None:
    c = cfg(
        """
        name: "ens"
        platform: "ensemble"
        max_batch_size: 1
        ensemble_scheduling {
          step [
            { model_name: "pre" model_version: -1
              input_map { key: "RAW" value: "IN" } output_map { key: "OUT" value: "mid" } },
            { model_name: "net" input_map { key: "X" value: "mid" } output_map { key: "Y" value: "OUT" } }
          ]
        }
        """,
        name="ens",
    )
    es = c.ensemble_scheduling
    assert es is not None and len(es.step) == 2
    assert dict(es.step[0].input_map) == {"RAW": "IN"} and es.step[1].model_version == -1
    assert unsupported_features(c) == []  # ensembles are supported


def test_instance_groups() -> None:
    c = cfg(
        """
        instance_group [
          { count: 2 kind: KIND_GPU gpus: [ 0, 1 ] },
          { name: "cpu" kind: KIND_CPU count: 3
            rate_limiter { resources [ { name: "R1" global: true count: 2 } ] priority: 2 } },
          { kind: KIND_MODEL secondary_devices [ { kind: KIND_NVDLA device_id: 1 } ]
            profile: [ "0" ] passive: true host_policy: "policy" }
        ]
        """
    )
    g0, g1, g2 = c.instance_group
    assert (g0.name, g0.kind, g0.count, g0.gpus) == ("add_0", InstanceKind.KIND_GPU, 2, (0, 1))
    assert g0.kind == "KIND_GPU"
    assert g1.name == "cpu" and g1.rate_limiter is not None and g1.rate_limiter.priority == 2
    assert g1.rate_limiter.resources[0].is_global
    assert g2.count == 1 and g2.secondary_devices[0].device_id == 1 and g2.passive
    assert unsupported_features(c) == [
        "instance_group.secondary_devices",
        "instance_group.profile",
        "instance_group.passive",
        "instance_group.host_policy",
    ]


def test_everything_else() -> None:
    c = cfg(
        """
        max_batch_size: 8
        batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "N" data_type: TYPE_INT32 source_input: "A" } ]
        batch_output [ { target_name: [ "B" ] kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: [ "A" ] } ]
        optimization {
          graph { level: 1 }
          priority: PRIORITY_MAX
          eager_batching: true
          input_pinned_memory { enable: false }
          output_pinned_memory { }
          gather_kernel_buffer_threshold: 2
          cuda { graphs: true busy_wait_events: true output_copy_stream: true
                 graph_spec [ { batch_size: 4 input { key: "A" value: { dim: [ 4 ] } }
                                graph_lower_bound { batch_size: 1
                                                    input { key: "A" value { dim: [ 1 ] } } } } ] }
          execution_accelerators {
            gpu_execution_accelerator [ { name: "tensorrt"
              parameters { key: "precision_mode" value: "FP16" } } ]
            cpu_execution_accelerator: [ { name: "openvino" } ]
          }
        }
        parameters { key: "kernel" value: { string_value: "add" } }
        parameters: { key: "empty" value: { } }
        metric_tags { key: "team" value: "infra" }
        model_warmup [ { name: "w" batch_size: 2 count: 3
          inputs { key: "A" value: { data_type: TYPE_FP32 dims: [ 4 ] random_data: true } } } ]
        model_transaction_policy { decoupled: true }
        response_cache { enable: true }
        model_metrics { metric_control [ {
          metric_identifier { family: "nv_inference_first_response_histogram_ms" }
          histogram_options { buckets: [ -1, 0.5, 2, 10 ] } } ] }
        default_model_filename: "model.py"
        """
    )
    assert c.batch_input[0].kind is BatchInputKind.BATCH_ELEMENT_COUNT
    assert c.batch_output[0].target_name == ("B",)
    opt = c.optimization
    assert opt.graph_level == 1 and opt.priority is ModelPriority.PRIORITY_MAX
    assert not opt.input_pinned_memory and not opt.output_pinned_memory
    assert opt.cuda is not None and opt.cuda.graph_spec[0].graph_lower_bound is not None
    assert dict(opt.cuda.graph_spec[0].input) == {"A": (4,)}
    assert opt.execution_accelerators is not None
    assert dict(opt.execution_accelerators.gpu_execution_accelerator[0].parameters) == {
        "precision_mode": "FP16"
    }
    assert dict(c.parameters) == {"kernel": "add", "empty": ""}
    assert dict(c.metric_tags) == {"team": "infra"}
    assert c.model_warmup[0].inputs["A"].random_data
    assert c.decoupled and c.response_cache.enable
    assert c.model_metrics is not None and c.model_metrics.metric_control[0].buckets == (-1.0, 0.5, 2.0, 10.0)
    assert unsupported_features(c) == [
        "default_model_filename",
        "batch_input",
        "batch_output",
        "optimization",
        "model_metrics",
    ]
    json.dumps(c.to_dict())


# ----------------------------------------------------------------------------------------- JSON form


def test_to_dict_shape() -> None:
    c = cfg(
        'name: "add" backend: "zinfer" max_batch_size: 8 dynamic_batching { }\n'
        'input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 2, 2 ] } } ]\n'
        'output [ { name: "B" data_type: TYPE_STRING dims: [ -1 ] } ]\n'
        'parameters { key: "k" value { string_value: "v" } }\n'
        "instance_group { kind: KIND_CPU count: 2 rate_limiter { resources { name: 'r' global: true } } }\n"
    )
    d = c.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["name"] == "add" and d["max_batch_size"] == 8 and d["backend"] == "zinfer"
    assert d["version_policy"] == {"latest": {"num_versions": 1}}
    assert d["input"][0]["name"] == "A" and d["input"][0]["data_type"] == "TYPE_FP32"
    assert d["input"][0]["dims"] == [4] and d["input"][0]["reshape"] == {"shape": [2, 2]}
    assert d["input"][0]["format"] == "FORMAT_NONE"
    assert "reshape" not in d["output"][0] and d["output"][0]["label_filename"] == ""
    assert d["dynamic_batching"]["preferred_batch_size"] == [8]
    assert "sequence_batching" not in d and "ensemble_scheduling" not in d
    assert d["parameters"] == {"k": {"string_value": "v"}}
    group = d["instance_group"][0]
    assert group["kind"] == "KIND_CPU" and group["count"] == 2 and group["name"] == "add_0"
    assert group["rate_limiter"]["resources"][0]["global"] is True
    assert d["optimization"]["input_pinned_memory"] == {"enable": True}
    assert d["model_transaction_policy"] == {"decoupled": False}


def test_to_dict_other_policies() -> None:
    assert cfg("version_policy { all { } }").to_dict()["version_policy"] == {"all": {}}
    spec = cfg("version_policy { specific { versions: 2 } }").to_dict()["version_policy"]
    assert spec == {"specific": {"versions": [2]}}
    d = cfg(
        "max_batch_size: 2 dynamic_batching { priority_levels: 2 default_priority_level: 1 "
        "priority_queue_policy { key: 2 value { timeout_action: DELAY } } }"
    ).to_dict()
    assert d["dynamic_batching"]["priority_queue_policy"]["2"]["timeout_action"] == "DELAY"


# ----------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "input [ { name: 'A' data_type: TYPE_FP32\n dims: [ 1,\n x ] } ]",
            ":3: field 'dims': expected an integer, got 'x'",
        ),
        ("bogus: 1", ":1: field 'bogus': unknown field"),
        ("max_batch_size: 1\nmax_batch_size: 2", ":2: field 'max_batch_size': given more than once"),
        ("max_batch_size: [ 1 ]", ":1: field 'max_batch_size': takes one value, not a list"),
        ("max_batch_size: 'x'", ":1: field 'max_batch_size': expected an integer, got the string \"x\""),
        ("max_batch_size: 1.5", "field 'max_batch_size': expected an integer, got 1.5"),
        ("max_batch_size: true", "field 'max_batch_size': expected an integer, got true"),
        ("max_batch_size: -1", "field 'max_batch_size': must be >= 0, got -1"),
        ("max_batch_size: 4294967296", "field 'max_batch_size': 4294967296 is out of range"),
        ("platform: onnx", "field 'platform': expected a quoted string, got 'onnx'"),
        ("name: 'other'", ":1: field 'name': 'other' must equal the model's directory name 'add'"),
        ("input { name: 'A' data_type: FP32 dims: 1 }", "field 'data_type': expected one of TYPE_BF16"),
        ("input { name: 'A' data_type: 'TYPE_FP32' dims: 1 }", "field 'data_type': expected one of"),
        ("input { name: 'A' dims: 1 }", "field 'data_type': is required"),
        ("input { name: 'A' data_type: TYPE_INVALID dims: 1 }", "field 'data_type': expected one of"),
        ("input { data_type: TYPE_FP32 dims: 1 }", "field 'name': is required and may not be empty"),
        ("input { name: 'A' data_type: TYPE_FP32 }", "field 'dims': is required and may not be empty"),
        ("input { name: 'A' data_type: TYPE_FP32 dims: [] }", "field 'dims': is required"),
        ("input { name: 'A' data_type: TYPE_FP32 dims: [ 0 ] }", "field 'dims': a dimension must be >= 1"),
        ("input { name: 'A' data_type: TYPE_FP32 dims: [ -2 ] }", "field 'dims': a dimension must be >= 1"),
        (
            "input { name: 'A' data_type: TYPE_FP32 dims: 4 reshape { shape: [ 3 ] } }",
            "field 'reshape': shape [3]",
        ),
        (
            "input { name: 'A' data_type: TYPE_FP32 dims: [ -1, 4 ] reshape { shape: [ 4 ] } }",
            "field 'reshape'",
        ),
        (
            "input { name: 'A' data_type: TYPE_FP32 dims: 4 format: FORMAT_XYZ }",
            "field 'format': expected one of",
        ),
        (
            "input { name: 'A' data_type: TYPE_FP32 dims: 4 label_filename: 'x' }",
            "field 'label_filename': unknown",
        ),
        (
            "output { name: 'A' data_type: TYPE_FP32 dims: 4 optional: true }",
            "field 'optional': unknown field",
        ),
        (
            "input { name: 'A' data_type: TYPE_FP32 dims: 4 optional: 2 }",
            "field 'optional': expected true or false",
        ),
        (
            "input [ { name: 'A' data_type: TYPE_FP32 dims: 4 },\n{ name: 'A' data_type: "
            "TYPE_FP32 dims: 4 } ]",
            ":2: field 'name': input name 'A' is used twice",
        ),
        (
            "output [ { name: 'A' data_type: TYPE_FP32 dims: 4 },\n{ name: 'A' data_type: "
            "TYPE_FP32 dims: 4 } ]",
            ":2: field 'name': output name 'A' is used twice",
        ),
        ("input: 5", "field 'input': expected a message block"),
        (
            "max_batch_size: 4\ndynamic_batching { }\nsequence_batching { }",
            ":3: field 'sequence_batching': only one of dynamic_batching, sequence_batching, "
            "ensemble_scheduling",
        ),
        (
            "dynamic_batching { }\nensemble_scheduling { step { model_name: 'x' } }",
            ":2: field 'ensemble_scheduling'",
        ),
        (
            "max_batch_size: 4 dynamic_batching { preferred_batch_size: [ 2, 5 ] }",
            "field 'preferred_batch_size': 5 is not in [1, max_batch_size=4]",
        ),
        ("dynamic_batching { preferred_batch_size: 1 }", "max_batch_size 0 takes no preferred batch size"),
        (
            "max_batch_size: 4 dynamic_batching { preferred_batch_size: 0 }",
            "0 is not in [1, max_batch_size=4]",
        ),
        (
            "dynamic_batching { priority_levels: 2 }",
            "field 'default_priority_level': must be in [1, priority_levels=2]",
        ),
        (
            "dynamic_batching { priority_levels: 2 default_priority_level: 3 }",
            "must be in [1, priority_levels=2], got 3",
        ),
        ("dynamic_batching { default_priority_level: 1 }", "needs priority_levels > 0"),
        (
            "dynamic_batching { priority_levels: 1 default_priority_level: 1\n"
            "priority_queue_policy { key: 2 value { } } }",
            ":2: field 'priority_queue_policy': priority level 2",
        ),
        (
            "dynamic_batching { priority_levels: 2 default_priority_level: 1 "
            "priority_queue_policy { key: 1 value { } }\n"
            "priority_queue_policy { key: 1 value { } } }",
            ":2: field 'priority_queue_policy': key 1 given twice",
        ),
        (
            "dynamic_batching { priority_levels: 2 default_priority_level: 1 "
            "priority_queue_policy { key: 1 } }",
            "field 'priority_queue_policy': every map entry needs a 'value'",
        ),
        (
            "dynamic_batching { default_queue_policy { timeout_action: DROP } }",
            "field 'timeout_action': expected one of DELAY, REJECT",
        ),
        (
            "dynamic_batching { max_queue_delay_microseconds: -5 }",
            "field 'max_queue_delay_microseconds': -5 is out of range",
        ),
        (
            "max_batch_size: 4 dynamic_batching { zinfer_latency_target_microseconds: -1 }",
            "field 'zinfer_latency_target_microseconds': -1 is out of range",
        ),
        (
            "max_batch_size: 4 dynamic_batching { zinfer_latency_target_microseconds: 1.5 }",
            "field 'zinfer_latency_target_microseconds'",
        ),
        (
            "max_batch_size: 4 dynamic_batching { zinfer_latency_target_microseconds: 1 "
            "zinfer_latency_target_microseconds: 2 }",
            "field 'zinfer_latency_target_microseconds'",
        ),
        (
            "version_policy { latest { num_versions: 1 } all { } }",
            "field 'all': only one of latest, all, specific",
        ),
        ("version_policy { latest { num_versions: 0 } }", "field 'num_versions': must be >= 1"),
        ("version_policy { specific { } }", "field 'versions': 'specific' needs at least one version"),
        ("version_policy { specific { versions: -1 } }", "field 'versions': must be >= 0, got -1"),
        ("version_policy { newest { } }", "field 'newest': unknown field"),
        ("instance_group { count: 0 }", "field 'count': must be >= 1, got 0"),
        (
            "instance_group { kind: KIND_TPU }",
            "field 'kind': expected one of KIND_AUTO, KIND_CPU, KIND_GPU, KIND_MODEL",
        ),
        ("instance_group { kind: KIND_CPU gpus: 0 }", "field 'gpus': may not be given for KIND_CPU"),
        ("instance_group { gpus: -1 }", "field 'gpus': must be >= 0"),
        ("instance_group { rate_limiter { resources { count: 1 } } }", "field 'name': is required"),
        (
            "parameters { key: 'x' value: { string_value: 1 } }",
            "field 'string_value': expected a quoted string, got 1",
        ),
        ("parameters { key: 'x' value: 'y' }", "field 'value': expected a message block"),
        (
            "parameters { key: 'x' value { string_value: 'a' } }\nparameters { key: 'x' value { } }",
            ":2: field 'parameters': key 'x' given twice",
        ),
        ("metric_tags { key: 'a' value: 'b' extra: 1 }", "field 'extra': unknown field"),
        ("sequence_batching { direct { } oldest { } }", "field 'oldest': only one of direct, oldest"),
        (
            "sequence_batching { direct { minimum_slot_utilization: 2 } }",
            "field 'minimum_slot_utilization': must be in [0, 1]",
        ),
        (
            "sequence_batching { control_input { name: 'S' control { kind: CONTROL_SEQUENCE_START } } }",
            "field 'kind': CONTROL_SEQUENCE_START needs exactly one of",
        ),
        (
            "sequence_batching { control_input { name: 'S' control { kind: CONTROL_SEQUENCE_END "
            "int32_false_true: [ 1 ] } } }",
            "field 'int32_false_true': takes two values: false, then true",
        ),
        (
            "sequence_batching { control_input { name: 'S' control { kind: "
            "CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 } } }",
            "field 'data_type': CONTROL_SEQUENCE_CORRID needs data_type",
        ),
        (
            "sequence_batching { state { input_name: 'a' output_name: 'b' data_type: TYPE_FP32 dims: 1 "
            "initial_state { data_type: TYPE_FP32 name: 'i' } } }",
            "needs zero_data or data_file",
        ),
        ("ensemble_scheduling { }", "field 'step': an ensemble needs at least one step"),
        ("ensemble_scheduling { step { model_version: 1 } }", "field 'model_name': is required"),
        (
            "ensemble_scheduling { step { model_name: 'm' input_map { key: 'a' value: 1 } } }",
            "field 'value': expected a quoted string",
        ),
        (
            "model_warmup { name: 'w' batch_size: 2 inputs { key: 'A' value { data_type: "
            "TYPE_FP32 zero_data: true } } }",
            "field 'batch_size': must be in [1, 1]",
        ),
        (
            "model_warmup { name: 'w' batch_size: 1 inputs { key: 'A' value { data_type: TYPE_FP32 } } }",
            "needs one of zero_data, random_data, input_data_file",
        ),
        (
            "model_warmup { name: 'w' batch_size: 1 inputs { key: 'A' value { data_type: "
            "TYPE_FP32 zero_data: true random_data: true } } }",
            "field 'random_data': only one of zero_data, random_data, input_data_file",
        ),
        ("optimization { priority: PRIORITY_HIGH }", "field 'priority': expected one of"),
        ("optimization { cuda { graphs: yes } }", "field 'graphs': expected true or false, got 'yes'"),
        ("optimization { input_pinned_memory { enabled: true } }", "field 'enabled': unknown field"),
        (
            "model_metrics { metric_control { histogram_options { buckets: [ 2, 1 ] } "
            "metric_identifier { family: 'f' } } }",
            "field 'buckets': must be in ascending order",
        ),
        ("model_transaction_policy { decoupled: 'yes' }", "field 'decoupled': expected true or false"),
        ("response_cache { enable: true size: 1 }", "field 'size': unknown field"),
        (
            "batch_input { kind: BATCH_ITEM_SHAPE target_name: 't' data_type: TYPE_INT64 }",
            "must be TYPE_INT32 or TYPE_FP32",
        ),
        ("batch_output { kind: BATCH_SCATTER_WITH_INPUT_SHAPE }", "field 'target_name': is required"),
    ],
)
def test_errors_name_file_line_and_field(text: str, expected: str) -> None:
    message = err(text)
    assert message.startswith(f"{SRC}:"), message
    assert expected in message, message


UNKNOWN_FIELD_SITES = [
    "version_policy { latest { num_versions: 1 X: 1 } }",
    "version_policy { all { X: 1 } }",
    "version_policy { specific { versions: 1 X: 1 } }",
    "input { name: 'A' data_type: TYPE_FP32 dims: 4 reshape { shape: 4 X: 1 } }",
    "output { name: 'A' data_type: TYPE_FP32 dims: 4 X: 1 }",
    "batch_input { target_name: 't' data_type: TYPE_INT32 X: 1 }",
    "batch_output { target_name: 't' X: 1 }",
    "dynamic_batching { X: 1 }",
    "dynamic_batching { default_queue_policy { X: 1 } }",
    "dynamic_batching { priority_levels: 1 default_priority_level: 1 priority_queue_policy { "
    "key: 1 value { X: 1 } } }",
    "dynamic_batching { priority_levels: 1 default_priority_level: 1 priority_queue_policy { key: 1 X: 1 } }",
    "sequence_batching { X: 1 }",
    "sequence_batching { direct { X: 1 } }",
    "sequence_batching { oldest { X: 1 } }",
    "sequence_batching { control_input { name: 's' X: 1 } }",
    "sequence_batching { control_input { name: 's' control { kind: CONTROL_SEQUENCE_CORRID "
    "data_type: TYPE_INT32 X: 1 } } }",
    "sequence_batching { state { input_name: 'a' output_name: 'b' data_type: TYPE_FP32 dims: 1 X: 1 } }",
    "sequence_batching { state { input_name: 'a' output_name: 'b' data_type: TYPE_FP32 dims: 1 "
    "initial_state { data_type: TYPE_FP32 name: 'i' zero_data: true X: 1 } } }",
    "ensemble_scheduling { X: 1 step { model_name: 'm' } }",
    "ensemble_scheduling { step { model_name: 'm' X: 1 } }",
    "instance_group { X: 1 }",
    "instance_group { rate_limiter { X: 1 } }",
    "instance_group { rate_limiter { resources { name: 'r' X: 1 } } }",
    "instance_group { secondary_devices { X: 1 } }",
    "parameters { key: 'k' value { X: 1 } }",
    "model_warmup { name: 'w' batch_size: 1 X: 1 }",
    "model_warmup { name: 'w' batch_size: 1 inputs { key: 'A' value { data_type: TYPE_FP32 "
    "zero_data: true X: 1 } } }",
    "model_transaction_policy { X: 1 }",
    "optimization { X: 1 }",
    "optimization { graph { X: 1 } }",
    "optimization { cuda { X: 1 } }",
    "optimization { cuda { graph_spec { X: 1 } } }",
    "optimization { cuda { graph_spec { graph_lower_bound { X: 1 } } } }",
    "optimization { cuda { graph_spec { input { key: 'a' value { X: 1 } } } } }",
    "optimization { execution_accelerators { X: 1 } }",
    "optimization { execution_accelerators { gpu_execution_accelerator { name: 'a' X: 1 } } }",
    "optimization { output_pinned_memory { X: 1 } }",
    "model_metrics { X: 1 }",
    "model_metrics { metric_control { metric_identifier { family: 'f' X: 1 } } }",
    "model_metrics { metric_control { metric_identifier { family: 'f' } histogram_options { X: 1 } } }",
    "model_operations { X: 1 }",
    "model_repository_agents { agents { name: 'a' X: 1 } }",
]


@pytest.mark.parametrize("text", UNKNOWN_FIELD_SITES)
def test_unknown_field_in_every_block(text: str) -> None:
    message = err("max_batch_size: 1\n" + text)
    assert message == f"{SRC}:2: field 'X': unknown field"


def test_load_model_config_from_file(tmp_path: Path) -> None:
    path = tmp_path / "add" / "config.pbtxt"
    path.parent.mkdir()
    path.write_text('name: "add"\n' + IO)
    assert load_model_config(path, "add").input[0].name == "A"
    path.write_text('name: "add"\nmax_batch_size: x\n')
    with pytest.raises(
        ConfigError, match=rf"^{path}:2: field 'max_batch_size': expected an integer, got 'x'$"
    ):
        load_model_config(path, "add")
    path.write_bytes(b"name: \xff")
    with pytest.raises(ConfigError, match="not valid UTF-8"):
        load_model_config(path, "add")
    with pytest.raises(ConfigError, match="cannot read"):
        load_model_config(tmp_path / "missing" / "config.pbtxt", "missing")


# ----------------------------------------------------------------------------------------- features


@pytest.mark.parametrize(
    ("text", "features"),
    [
        (
            "max_batch_size: 8 dynamic_batching { preferred_batch_size: [ 4 ] "
            "max_queue_delay_microseconds: 5 }",
            [],
        ),
        (
            "version_policy { all { } } parameters { key: 'a' value { } } metric_tags { key: "
            "'a' value: 'b' }",
            [],
        ),
        ("instance_group { name: 'g' kind: KIND_GPU count: 2 gpus: [ 0 ] }", []),
        ("input { name: 'A' data_type: TYPE_FP32 dims: 1 format: FORMAT_NONE }", []),
        ("input { name: 'A' data_type: TYPE_FP32 dims: [ 3, 8, 8 ] format: FORMAT_NCHW }", []),
        ("input { name: 'A' data_type: TYPE_FP32 dims: 1 optional: true }", []),
        (
            "input { name: 'A' data_type: TYPE_FP32 dims: 1 allow_ragged_batch: true }",
            ["input.allow_ragged_batch"],
        ),
        (
            "input { name: 'A' data_type: TYPE_INT32 dims: 1 is_shape_tensor: true }",
            ["input.is_shape_tensor"],
        ),
        (
            "output { name: 'A' data_type: TYPE_INT32 dims: 1 is_shape_tensor: true }",
            ["output.is_shape_tensor"],
        ),
        ("max_batch_size: 2 dynamic_batching { preserve_ordering: true }", []),
        ("max_batch_size: 2 dynamic_batching { priority_levels: 2 default_priority_level: 1 }", []),
        ("max_batch_size: 2 dynamic_batching { default_queue_policy { } }", []),
        ("max_batch_size: 2 dynamic_batching { zinfer_latency_target_microseconds: 900 }", []),
        ("max_batch_size: 2 dynamic_batching { zinfer_latency_target_microseconds: 0 }", []),
        ("max_batch_size: 2 dynamic_batching { default_queue_policy { max_queue_size: 4 } }", []),
        ("max_batch_size: 2 sequence_batching { }", []),
        ("model_transaction_policy { decoupled: false } response_cache { enable: false }", []),
        ("optimization { }", []),
        ("optimization { input_pinned_memory { enable: true } }", []),
        ("optimization { eager_batching: true }", ["optimization"]),
        ("runtime: 'model.py'", ["runtime"]),
        ("model_operations { op_library_filename: 'libop.so' }", ["model_operations"]),
        ("model_repository_agents { agents { name: 'checksum' } }", ["model_repository_agents"]),
        ("cc_model_filenames { key: '7.5' value: 'm.plan' }", ["cc_model_filenames"]),
    ],
)
def test_unsupported_features(text: str, features: list[str]) -> None:
    assert unsupported_features(cfg(text)) == features


def test_supported_set_is_one_place(monkeypatch: pytest.MonkeyPatch) -> None:
    from zinfer.modelconfig import features as config_features

    c = cfg("max_batch_size: 2 sequence_batching { }")
    monkeypatch.setattr(
        config_features, "SUPPORTED_FEATURES", config_features.SUPPORTED_FEATURES | {"sequence_batching"}
    )
    assert unsupported_features(c) == []


def test_float_words_and_bool_numbers() -> None:
    c = cfg(
        "model_metrics { metric_control { metric_identifier { family: 'f' } histogram_options { "
        "buckets: [ -inf, 1, inf ] } } }"
        "\ninput { name: 'A' data_type: TYPE_FP32 dims: 1 optional: 1 }"
    )
    assert c.model_metrics is not None
    assert c.model_metrics.metric_control[0].buckets == (-math.inf, 1.0, math.inf)
    assert c.input[0].optional
