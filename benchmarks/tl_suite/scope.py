"""What of TransformerLens's own test suites is in scope for glassbox.tl, and why the rest is not.

In scope: every test of the HookedTransformer-era public surface that glassbox.tl provides
(README, "Coming from TransformerLens"), run unmodified. Left out, each path with its reason:
classes and packages glassbox.tl does not provide (encoders, encoder-decoders, BERT, HuBERT, LIT,
TransformerBridge and its benchmarks, TransformerLens's model registry and tools), tests of
TransformerLens's own private internals (its weight-conversion modules, component factories, docs
building, its CI scripts), hardware glassbox.tl refuses (several GPUs, MPS), and tests whose
assertions are the real pretrained model's numbers (losses, IOI accuracy, generated text), which
seeded stand-in weights cannot reproduce. A path is a file or folder (left out of collection) or a
pytest node id prefix (collected, then skipped with "OUT OF SCOPE: <why>"). TransformerLens 3.9's files
that mix HookedTransformer and TransformerBridge tests run: the runner's conftest gives ``model_bridge``
as a stand-in whose every use skips that test "OUT OF SCOPE" (so it is counted out of scope, not failed).
"""

ENCODERS = "encoder / encoder-decoder / BERT / HuBERT / T5 classes are out of glassbox.tl's scope"
BRIDGE = "TransformerBridge (TransformerLens's bridge API) is out of glassbox.tl's scope"
INTERNALS = "tests TransformerLens's private internals (its own conversion modules / factories), not the public API"
REAL = "asserts the real pretrained model's numbers; the stand-in weights are seeded random"
GPUS = "needs several GPUs or MPS; glassbox.tl puts a model on one device"
DOCS = "builds TransformerLens's documentation"
TOOLS = "TransformerLens's tools / model registry / benchmark scripts, not provided by glassbox.tl"
LIT = "TransformerLens's LIT integration is not provided"
TOKENIZER = ("asserts the real tokenizer's ids (NeelNanda/gpt-neox-tokenizer-digits, not on this machine: the "
             "stand-in holds GPT-2's) or the real model's sizes (d_vocab 48262, d_model 512)")

COMMON = [
    ("tests/acceptance/test_hooked_encoder.py", ENCODERS),
    ("tests/acceptance/test_hooked_encoder_decoder.py", ENCODERS),
    ("tests/integration/test_create_hooked_encoder.py", ENCODERS),
    ("tests/unit/test_hubert.py", ENCODERS),
    ("tests/unit/test_hubert_hooks.py", ENCODERS),
    ("tests/unit/pretrained_weight_conversions/test_hubert_weights.py", ENCODERS),
    ("tests/unit/test_next_sentence_prediction.py", ENCODERS),
    ("tests/acceptance/test_multi_gpu.py", GPUS),
    ("tests/unit/utilities/test_devices.py", GPUS),
    ("tests/unit/test_make_docs.py", DOCS),
    ("tests/unit/test_lit.py", LIT),
    ("tests/manual_checks", "manual checks, not tests (no test functions pytest collects)"),
    ("tests/unit/pretrained_weight_conversions", INTERNALS),
    ("tests/unit/factories", INTERNALS),
    ("tests/unit/components/mlps/test_moe.py", INTERNALS + " (MoE, which glassbox refuses)"),
    # 2.18's name for 3.9's test_gpt_oss_moe_component.py: GPT-OSS's mixture-of-experts MLP component
    ("tests/unit/components/mlps/test_gpt_oss_moe.py", INTERNALS + " (MoE, which glassbox refuses)"),
    ("tests/unit/test_gemma3_config.py", "tests TransformerLens's table of per-name configs with "
     "loading_from_pretrained.AutoConfig mocked; glassbox reads each model's config.json (its named-model "
     "loading machinery is out of scope, README)"),
    ("tests/acceptance/test_hooked_transformer.py::test_model", REAL),
    ("tests/acceptance/test_hooked_transformer.py::test_othello_gpt", REAL),
    ("tests/acceptance/test_hooked_transformer.py::test_from_pretrained_no_processing", REAL),
    ("tests/acceptance/test_hooked_transformer.py::test_process_weights_inplace", REAL),
    ("tests/acceptance/test_hooked_transformer.py::test_bloom_similarity_with_hf_model_with_kv_cache_activated",
     REAL),
    ("tests/acceptance/test_hooked_transformer.py::test_all_tinystories_models_exist", "asks the hub for every repo"),
    ("tests/acceptance/test_hooked_transformer.py::test_all_pythia_models_exist", "asks the hub for every repo"),
    ("tests/acceptance/test_evals.py::test_basic_ioi_eval", REAL),
    ("tests/acceptance/test_evals.py::test_symmetric_samples", REAL),
    ("tests/acceptance/test_evals.py::test_custom_dataset_ioi_eval", REAL),
    ("tests/acceptance/test_evals.py::test_multitoken_names_ioi_eval", REAL),
    ("tests/acceptance/test_evals.py::test_inverted_template", REAL),
    ("tests/unit/test_utils.py::TestTokenizeAndConcatenate::test_no_split_tokens_across_chunks",
     "calls .numpy() on a Dataset column, which datasets 4.x returns as a lazy Column without it: TransformerLens "
     "3.9's own tokenize_and_concatenate fails it the same way with the datasets installed here"),
    ("tests/unit/test_utils.py::test_tokenize_and_concatenate_no_spurious_sequence_length_warning",
     "loads t5-small's tokenizer (SentencePiece, model_max_length 512), which is not on this machine; a stand-in "
     "with GPT-2's tokenizer would not be the tokenizer the test is about"),
    # TransformerLens's own-format stand-ins (solu-1l, solu-2l): the real model's scores, token ids, sizes
    ("tests/integration/test_head_detector.py::Test_detect_head_successful", REAL),
    ("tests/integration/test_head_detector.py::Test_specific_heads", REAL),
    ("tests/integration/test_head_detector.py::test_detect_head_exclude_bos", REAL),
    ("tests/integration/test_head_detector.py::test_detect_head_exclude_current_token", REAL),
    ("tests/integration/test_head_detector.py::test_detect_head_with_cache", REAL),
    ("tests/integration/test_head_detector.py::test_detect_head_exclude_bos_and_current_token", REAL),
    ("tests/unit/test_svd_interpreter.py::test_svd_interpreter", REAL),
    ("tests/unit/test_svd_interpreter.py::test_w_in_when_fold_ln_is_false", REAL),
    *((f"tests/integration/test_tokenization_methods.py::{name}", TOKENIZER) for name in (
        "test_set_tokenizer_during_initialization", "test_to_tokens_default", "test_to_tokens_without_bos",
        "test_to_string_multiple", "test_to_str_tokens_default", "test_to_str_tokens_without_bos",
        "test_to_single_token", "test_to_single_str_tokent", "test_get_token_position_not_found",
        "test_tokens_to_residual_directions")),
    ("tests/integration/test_utils_tokens.py::test_test_prompt", TOKENIZER),
]

CONFIGS = ("tests TransformerLens's per-architecture config conversion (convert_hf_model_config / "
           "get_pretrained_model_config with AutoConfig mocked); glassbox reads each model's config.json")
QUANT = "quantised weights (MXFP4, bitsandbytes, FP8), which glassbox refuses"
LFP = "tests/unit/test_loading_from_pretrained_utilities.py::"
DEP = "tests/unit/test_deprecation_warnings.py::"
TO_BRIDGE = ("asserts TransformerLens 3.9's DeprecationWarning that sends HookedTransformer users to TransformerBridge, "
             "which glassbox.tl does not have (its HookedTransformer is not deprecated)")

V39_ONLY = [
    ("tests/unit/test_dropped_inference_ops.py", CONFIGS + "; and T5's encoder-decoder"),
    ("tests/unit/test_post_norm_processing_guards.py", CONFIGS + "; and weight_processing.ProcessWeights"),
    ("tests/unit/test_moe_fold_guard.py", INTERNALS + " (MoE, which glassbox refuses)"),
    ("tests/unit/utilities/test_hf_utils.py", "TransformerLens's Hugging Face hub retry (HTTP 429) and its patches "
     "to transformers' config and tokenizer classes; glassbox.tl reads the local cache only and patches nothing"),
    (DEP + "test_hooked_transformer_constructor_warns_once", TO_BRIDGE),
    (DEP + "test_direct_hooked_root_module_construction_warns_once", TO_BRIDGE),
    (DEP + "test_hooked_encoder_constructor_warns_once", ENCODERS),
    (DEP + "test_hooked_encoder_from_pretrained_warning_reaches_external_caller", ENCODERS),
    (DEP + "test_bert_next_sentence_prediction_constructor_warns_once", ENCODERS),
    (LFP + "TestMxfp4DequantizeConfig", QUANT),
    (LFP + "TestUnsupportedQuantizationRefusal", QUANT),
    (LFP + "TestQuantizationMethodCapture", QUANT),
    (LFP + "TestArchitectureConfigs", CONFIGS),
    (LFP + "TestHetConfigThroughConvertHfModelConfig", CONFIGS),
    (LFP + "test_qwen_uses_hf_seq_length_for_n_ctx", CONFIGS),
    (LFP + "test_qwen2_uses_hf_max_position_embeddings_for_n_ctx", CONFIGS),
    ("tests/acceptance/model_bridge", BRIDGE),
    ("tests/integration/model_bridge", BRIDGE),
    ("tests/unit/model_bridge", BRIDGE),
    ("tests/unit/test_multimodal_bridge.py", BRIDGE),
    ("tests/unit/test_optional_submodule.py", BRIDGE + " (the bridge's optional submodules, ArchitectureAdapter)"),
    ("tests/unit/utilities/test_aliases.py", BRIDGE + " (utilities.aliases: the bridge's hook aliases)"),
    ("tests/benchmarks", TOOLS),
    ("tests/integration/benchmarks", TOOLS),
    ("tests/unit/benchmarks", TOOLS),
    ("tests/unit/test_benchmark_utils.py", TOOLS),
    ("tests/unit/tools", TOOLS),
    ("tests/unit/model_registry", TOOLS),
    ("tests/unit/scripts", TOOLS),
    ("tests/unit/test_supported_models.py", TOOLS),
    ("tests/unit/test_verify_models_phase_defaults.py", TOOLS),
    ("tests/unit/test_gradient_mismatch_grading.py", TOOLS),
    ("tests/unit/weight_conversion", INTERNALS),
    ("tests/unit/test_weight_processing.py", INTERNALS + " (weight_processing.ProcessWeights)"),
    ("tests/integration/test_centralized_weight_processing.py", INTERNALS + " (weight_processing)"),
    ("tests/integration/test_weight_processing_integration.py", INTERNALS + " (weight_processing.ProcessWeights)"),
    ("tests/integration/test_fold_layer_integration.py", INTERNALS + " (weight_processing.ProcessWeights)"),
    ("tests/integration/test_tensor_extraction_consistency.py", INTERNALS + " (weight_processing.ProcessWeights)"),
    ("tests/integration/test_jacobian_lens.py", TOOLS),
    ("tests/integration/test_jacobian_lens_kurtosis.py", TOOLS),
    ("tests/integration/test_jacobian_lens_oracle_parity.py", TOOLS),
    ("tests/integration/test_backward_lens.py", TOOLS),
    ("tests/integration/test_attribution_patching.py", TOOLS),
    ("tests/integration/test_hooked_encoder_properties.py", ENCODERS),
    ("tests/unit/test_tracr_conversion.py", TOOLS + " (tracr)"),
    ("tests/unit/components/mlps/test_gpt_oss_moe_component.py", INTERNALS + " (MoE, which glassbox refuses)"),
    ("tests/mps", GPUS),
    ("tests/unit/utilities/test_multi_gpu_unit.py", GPUS),
    ("tests/unit/utilities/test_quantization_guards.py", "quantised weights, which glassbox refuses"),
    ("tests/integration/test_text_quality", TOOLS),
]


def scope(version: str) -> list:
    """[{"path": ..., "why": ...}] for TransformerLens ``version`` ("2.18" or "3.9")."""
    entries = COMMON + (V39_ONLY if version.startswith("3") else [])
    return [{"path": path, "why": why} for path, why in entries]
