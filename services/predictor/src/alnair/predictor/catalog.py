"""What the predictor knows about a model from its name alone.

Jobs name their model in an annotation (`alnair.io/model-name`, or the seeds' `model_name`).
The name gives the model family (the strongest feature for how a job uses a GPU), an
approximate parameter count and the activation memory one training sample needs. Names the
table does not hold are still parsed for a family and a depth ("resnet200", "vgg13",
"bert-large-uncased") so that an unknown model gets a prediction from its features; the
predictor flags such predictions as low-confidence.

Parameter counts are the published sizes of the reference implementations (torchvision,
HuggingFace, the Gavel workloads). Activation memory per sample is a rough fp32 training figure
consistent with the Gavel measurements (ResNet-50 at batch 128 does not fit a 12 GiB K80 but
fits a 16 GiB P100, so 88-120 MiB per sample); it only feeds the memory estimate until execution
records teach better.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache

from alnair.common.colocation import (
    DEFAULT_BATCH_SIZE,
    ONE_SAMPLE_PER_STEP,
    default_batch_size,
    normalize_model_name,
)

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "FAMILIES",
    "ONE_SAMPLE_PER_STEP",
    "ModelInfo",
    "default_batch_size",
    "describe_model",
    "normalize_model_name",
]

FAMILIES: tuple[str, ...] = (
    "resnet",
    "vgg",
    "densenet",
    "mobilenet",
    "inception",
    "transformer",
    "lm",
    "recommendation",
    "rl",
    "gan",
    "other",
)


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """Static description of a model, from the table or parsed from its name."""

    name: str
    family: str
    params_m: float
    activation_mib_per_sample: float
    in_table: bool

    def features(self) -> list[float]:
        """One-hot family and log parameter count."""
        return [1.0 if self.family == f else 0.0 for f in FAMILIES] + [math.log(self.params_m)]


# name -> (family, parameters in millions, activation MiB per training sample)
_TABLE: dict[str, tuple[str, float, float]] = {
    "resnet18": ("resnet", 11.7, 38.0),
    "resnet34": ("resnet", 21.8, 55.0),
    "resnet50": ("resnet", 25.6, 95.0),
    "resnet101": ("resnet", 44.5, 140.0),
    "resnet152": ("resnet", 60.2, 195.0),
    "vgg16": ("vgg", 138.4, 110.0),
    "vgg19": ("vgg", 143.7, 125.0),
    "densenet121": ("densenet", 8.0, 120.0),
    "densenet169": ("densenet", 14.1, 140.0),
    "mobilenetv2": ("mobilenet", 3.5, 45.0),
    "inceptionv3": ("inception", 27.2, 90.0),
    "transformer": ("transformer", 50.0, 30.0),
    "bertbase": ("transformer", 110.0, 60.0),
    "bertlarge": ("transformer", 340.0, 160.0),
    "gpt2": ("transformer", 124.0, 80.0),
    "lm": ("lm", 28.0, 12.0),
    "lstm": ("lm", 28.0, 12.0),
    "recommendation": ("recommendation", 8.0, 0.6),
    "a3c": ("rl", 1.2, 20.0),
    "cyclegan": ("gan", 28.3, 1_500.0),
}

# Family defaults for names outside the table: (params in millions, activation MiB per sample).
_FAMILY_DEFAULTS: dict[str, tuple[float, float]] = {
    "resnet": (25.6, 95.0),
    "vgg": (138.4, 110.0),
    "densenet": (8.0, 120.0),
    "mobilenet": (3.5, 45.0),
    "inception": (27.2, 90.0),
    "transformer": (110.0, 60.0),
    "lm": (28.0, 12.0),
    "recommendation": (8.0, 0.6),
    "rl": (1.2, 20.0),
    "gan": (28.3, 1_500.0),
    "other": (25.0, 60.0),
}

_FAMILY_PATTERNS: tuple[tuple[str, str], ...] = (
    ("resnet", r"resnet|resnext|wideresnet"),
    ("vgg", r"vgg"),
    ("densenet", r"densenet"),
    ("mobilenet", r"mobilenet|efficientnet|shufflenet|squeezenet"),
    ("inception", r"inception|googlenet|xception"),
    ("transformer", r"transformer|bert|gpt|t5|llama|vit|roberta|bart|opt"),
    ("lm", r"lstm|gru|rnn|\blm\b|^lm"),
    ("recommendation", r"recommend|ncf|dlrm|autoencoder|wideanddeep"),
    ("rl", r"a3c|a2c|ppo|dqn|impala"),
    ("gan", r"gan|pix2pix"),
)


def _family_of(raw: str) -> str:
    lowered = raw.lower()
    for family, pattern in _FAMILY_PATTERNS:
        if re.search(pattern, lowered):
            return family
    return "other"


@lru_cache(maxsize=4096)
def describe_model(name: str) -> ModelInfo:
    """Family, size and activation memory of a model, from the table or from its name."""
    key = normalize_model_name(name)
    if key in _TABLE:
        family, params, activation = _TABLE[key]
        return ModelInfo(key, family, params, activation, in_table=True)
    family = _family_of(name)
    params, activation = _FAMILY_DEFAULTS[family]
    depth = re.search(r"(\d{2,3})", key)
    if family in {"resnet", "densenet", "vgg"} and depth is not None:
        # Deeper networks of one family grow roughly linearly in size and activations.
        reference = {"resnet": 50.0, "densenet": 121.0, "vgg": 16.0}[family]
        scale = max(0.25, min(4.0, int(depth.group(1)) / reference))
        params, activation = params * scale, activation * scale
    return ModelInfo(key, family, params, activation, in_table=False)
