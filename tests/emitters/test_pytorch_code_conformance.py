"""A representative sample of the ONNX backend node tests, per op family: generated code is run and
compared with the expected outputs. The whole suite runs in bench/pytorch_code_conformance.py."""

from __future__ import annotations

import pytest

from modelport.emitters.pytorch_code.conformance import collect_cases, run_case

SAMPLE = {
    "conv": ["test_conv_with_strides_padding", "test_conv_with_autopad_same", "test_convtranspose",
             "test_convtranspose_pads", "test_conv_with_strides_and_asymmetric_padding"],
    "pooling": ["test_maxpool_2d_pads", "test_maxpool_2d_same_upper", "test_averagepool_2d_pads",
                "test_globalaveragepool", "test_maxpool_2d_ceil", "test_averagepool_2d_dilations",
                "test_averagepool_3d_dilations_large_count_include_pad_is_0_ceil_mode_is_True",
                "test_maxpool_with_argmax_2d_precomputed_pads", "test_maxpool_with_argmax_2d_precomputed_strides"],
    "normalization": ["test_batchnorm_example", "test_layer_normalization_4d_axis1",
                      "test_instancenorm_example", "test_group_normalization_example",
                      "test_batchnorm_example_training_mode", "test_batchnorm_epsilon_training_mode"],
    "resize": ["test_resize_upsample_scales_nearest", "test_resize_upsample_scales_linear",
               "test_resize_upsample_scales_linear_align_corners", "test_resize_downsample_sizes_cubic",
               "test_resize_upsample_sizes_nearest_ceil_half_pixel", "test_resize_tf_crop_and_resize_axes_2_3",
               "test_resize_upsample_sizes_nearest_not_larger", "test_resize_upsample_scales_cubic_A_n0p5_exclude_outside",
               "test_upsample_nearest", "test_gridsample_bilinear", "test_gridsample_reflection_padding"],
    "attention": ["test_attention_4d", "test_attention_3d_gqa", "test_attention_4d_causal_with_past_and_present",
                  "test_attention_4d_softcap_neginf_mask", "test_attention_4d_with_qk_matmul_softmax",
                  "test_attention_local_window", "test_attention_4d_gqa_causal_nonpad_decode"],
    "control": ["test_loop11", "test_if", "test_range_float_type_positive_delta_expanded"],
    "activation": ["test_relu", "test_gelu_tanh_1", "test_softmax_axis_0", "test_leakyrelu", "test_hardsigmoid",
                   "test_logsoftmax_axis_1"],
    "elementwise": ["test_add_bcast", "test_div_int32_trunc", "test_pow", "test_where_example", "test_clip", "test_erf",
                    "test_mod_mixed_sign_int64", "test_cast_FLOAT_to_FLOAT16"],
    "linear": ["test_gemm_all_attributes", "test_matmul_3d", "test_einsum_batch_matmul"],
    "shape": ["test_reshape_negative_dim", "test_reshape_zero_dim", "test_transpose_all_permutations_3",
              "test_concat_3d_axis_negative_1", "test_unsqueeze_negative_axes", "test_squeeze", "test_expand_dim_changed",
              "test_flatten_axis2", "test_split_variable_parts_2d_opset18", "test_shape_start_1_end_negative_1",
              "test_edge_pad", "test_reflect_pad", "test_depthtospace_example", "test_constant_pad_negative_axes"],
    "indexing": ["test_slice_neg_steps", "test_slice_default_axes", "test_gather_1", "test_gather_elements_negative_indices",
                 "test_gathernd_example_int32_batch_dim1", "test_top_k", "test_cumsum_1d_reverse_exclusive",
                 "test_top_k_same_values_largest"],
    "reduce": ["test_reduce_mean_keepdims_example", "test_reduce_sum_do_not_keepdims_example",
               "test_reduce_log_sum_exp_default_axes_keepdims_example", "test_argmax_negative_axis_keepdims_example",
               "test_reduce_sum_empty_axes_input_noop"],
    "rnn": ["test_lstm_defaults", "test_lstm_with_initial_bias", "test_lstm_batchwise", "test_gru_defaults",
            "test_gru_with_initial_bias", "test_gru_seq_length", "test_simple_rnn_defaults", "test_rnn_seq_length",
            "test_lstm_with_peepholes"],
    "expanded": ["test_softmax_axis_1_expanded", "test_layer_normalization_2d_axis0_expanded", "test_gelu_default_1_expanded"],
}
NAMES = [n for names in SAMPLE.values() for n in names]


@pytest.fixture(scope="module")
def cases():
    found = {c.name: c for c in collect_cases(set(NAMES))}
    missing = set(NAMES) - set(found)
    assert not missing, f"node cases not in this onnx version: {sorted(missing)}"
    return found


@pytest.mark.parametrize("name", NAMES)
def test_node_case(cases, name):
    outcome = run_case(cases[name])
    assert outcome.ok, f"{outcome.stage}: {outcome.detail}"
