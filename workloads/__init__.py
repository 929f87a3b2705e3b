"""What is trained: torchvision ResNet/VGG and a tiny CNN, synthetic and digits data, flat buffers."""

from workloads.data import DATASETS, make_dataset
from workloads.flat import FlatModel, consensus_distance
from workloads.models import MODELS, build_model, param_count

__all__ = ["DATASETS", "MODELS", "FlatModel", "build_model", "consensus_distance", "make_dataset",
           "param_count"]
