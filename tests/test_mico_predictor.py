"""Mico §3.2: bucket labels, the text predictor's held-out accuracy, online updates, error."""


import numpy as np
import pytest

from app.config import AppConfig
from app.length_buckets import LengthBuckets
from app.length_predictor import BucketLengthPredictor
from app.predict import BucketMedianPredictor
from app.prediction_error import PredictionErrors
from app.predictor_config import PredictorConfig, make_predictor
from app.prompt_data import load_pairs, split_by_conversation
from core.classes import LengthClassConfig


@pytest.fixture(scope="module")
def predictor() -> BucketLengthPredictor:
    return make_predictor(PredictorConfig(online_sample_rate=1.0, online_batch=4), LengthClassConfig(), 200)


@pytest.fixture(scope="module")
def held_out():
    return split_by_conversation(load_pairs())[1]


def test_uniform_buckets_follow_mico_labels() -> None:
    b = LengthBuckets.uniform(700, 10)  # floor(l / (l_max / N))
    assert [b.label(n) for n in (0, 69, 70, 139, 140, 699, 700, 5000)] == [0, 0, 1, 1, 2, 9, 9, 9]
    assert b.midpoint_tokens(0) == 35 and b.midpoint_tokens(9) == 665


def test_length_class_buckets_match_dynamollm_thresholds() -> None:
    lengths = LengthClassConfig()
    b = LengthBuckets.from_length_classes(lengths, 700)
    for n in (1, 99, 100, 349, 350, 2000):
        assert "SML"[b.label(n)] == lengths.output_size(n)


def test_bad_edges_rejected() -> None:
    with pytest.raises(ValueError):
        LengthBuckets((0, 10, 10))


def test_split_keeps_conversations_on_one_side() -> None:
    train, held = split_by_conversation(load_pairs())
    assert set(train.conv_ids).isdisjoint(held.conv_ids) and 0.1 < len(held) / (len(train) + len(held)) < 0.3


def test_held_out_accuracy_beats_majority_bucket(predictor, held_out) -> None:
    """Measured: exact 0.28 vs 0.16, within-one 0.66 vs 0.34 (majority bucket of train)."""
    b = predictor.buckets
    train = split_by_conversation(load_pairs())[0]
    majority = np.bincount([b.label(n) for n in train.output_tokens]).argmax()
    truth = np.array([b.label(n) for n in held_out.output_tokens])
    pred = predictor.predict_buckets(held_out.prompts, held_out.prompt_tokens)
    assert np.mean(pred == truth) >= np.mean(truth == majority) + 0.08
    assert np.mean(np.abs(pred - truth) <= 1) >= np.mean(np.abs(truth - majority) <= 1) + 0.25


def test_prediction_is_a_bucket_midpoint_capped_at_max_tokens(predictor) -> None:
    n = predictor.predict(10, 4096, "Explain transformers in detail")
    assert n in {predictor.buckets.midpoint_tokens(k) for k in range(predictor.buckets.n)}
    assert predictor.predict(10, 7, "Explain transformers in detail") == 7


def test_online_updates_learn_from_sampled_requests() -> None:
    p = make_predictor(PredictorConfig(online_sample_rate=1.0, online_batch=4), LengthClassConfig(), 200)
    prompt = "zqxv wibble frobnicate"  # words the training data never saw
    before = p.predict_buckets([prompt], [3])[0]
    for i in range(40):
        p.predict(3, 4096, prompt, request_id=f"r{i}")
        p.observe(3, 690, 100, request_id=f"r{i}")
    assert p.updates == 10
    assert p.predict_buckets([prompt], [3])[0] > before


def test_unsampled_or_unknown_requests_do_not_train() -> None:
    p = make_predictor(PredictorConfig(online_sample_rate=0.0, online_batch=1), LengthClassConfig(), 200)
    p.predict(3, 4096, "hello", request_id="a")
    p.observe(3, 500, 100, request_id="a")
    p.observe(3, 500, 100, request_id="never-predicted")
    assert p.updates == 0


def test_errors_expose_accuracy_confusion_and_margin() -> None:
    e = PredictionErrors(LengthBuckets.uniform(700, 10))
    for predicted, actual in ((35, 35), (35, 100), (105, 400), (105, 105)):
        e.record(predicted, actual)
    assert e.exact_accuracy == 0.5 and e.within_one_accuracy == 0.75
    assert e.confusion().sum() == 4 and e.confusion()[5, 1] == 1
    assert e.margin_ratio(1.0) == pytest.approx(400 / 105)
    assert e.mean_relative_error == pytest.approx((0 + 65 / 100 + 295 / 400 + 0) / 4)


def test_errors_are_seeded_from_the_held_out_split(predictor) -> None:
    assert len(predictor.errors) > 500 and 0.2 < predictor.errors.exact_accuracy < 0.6


def test_config_selects_the_predictor() -> None:
    assert AppConfig().predictor.kind == "hashed_text"
    median = make_predictor(PredictorConfig(kind="bucket_median"), LengthClassConfig(), 123)
    assert isinstance(median, BucketMedianPredictor) and median.predict(5, 4096) == 123
    with pytest.raises(ValueError):
        PredictorConfig(kind="transformer")


def test_transformer_model_needs_its_packages_or_says_so(tmp_path) -> None:
    pytest.importorskip("sklearn")
    try:
        import transformers  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="transformers"):
            make_predictor(PredictorConfig(kind="transformer", model_path=str(tmp_path)), LengthClassConfig(), 200)
    else:
        pytest.skip("transformers installed: needs a real fine-tuned model directory")


def test_fast_probabilities_match_scikit_learn(predictor, held_out) -> None:
    texts, tokens = held_out.prompts[:50], held_out.prompt_tokens[:50]
    assert np.allclose(predictor.model.predict_proba(texts, tokens), predictor.model.sklearn_proba(texts, tokens))
