"""benchmarks/models.py: every harness model builds on its input shape."""
import pytest

from benchmarks.models import HARNESS_MODELS, INPUT_SHAPES, harness_model
from stack_required import import_stack_module

tf = import_stack_module("tensorflow")
pytestmark = pytest.mark.tf_stack


@pytest.mark.parametrize("name", HARNESS_MODELS)
def test_each_harness_model_takes_its_input_and_gives_ten_logits(name):
    model = harness_model(tf.keras, name)
    assert tuple(model.input_shape[1:]) == INPUT_SHAPES[name]
    assert model(tf.zeros((2,) + INPUT_SHAPES[name])).shape == (2, 10)


def test_the_transformer_is_an_encoder_of_attention_blocks():
    model = harness_model(tf.keras, "transformer")
    kinds = [type(l).__name__ for l in model.layers]
    assert kinds.count("MultiHeadAttention") == 4 and kinds.count("LayerNormalization") == 8
    assert model.count_params() == 3174154


def test_an_unknown_model_is_named():
    with pytest.raises(ValueError, match="unknown harness model 'vgg'"):
        harness_model(tf.keras, "vgg")
