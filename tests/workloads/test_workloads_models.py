"""Every model builds, runs at the sizes sweeps use, is reproducible from its seed, rejects bad arguments."""

import pytest
import torch
import torch.nn.functional as F

from workloads.models import MIN_IMAGE_SIZE, MODELS, build_model, param_count


@pytest.mark.parametrize("name,image_size", [("resnet18", 32), ("tiny", 8), ("tiny", 32)])
def test_model_trains_one_step(name, image_size):
    model = build_model(name, num_classes=10, image_size=image_size)
    x, y = torch.randn(2, 3, image_size, image_size), torch.tensor([3, 7])
    out = model(x)
    assert out.shape == (2, 10)
    F.cross_entropy(out, y).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("name", ["resnet50", "vgg11", "vgg16"])
def test_big_model_forward_at_32(name):
    model = build_model(name, num_classes=7, image_size=32).eval()
    with torch.no_grad():
        assert model(torch.randn(2, 3, 32, 32)).shape == (2, 7)


@pytest.mark.parametrize("name", ["tiny", "resnet18"])
def test_param_count_matches_built_model(name):
    model = build_model(name, num_classes=10)
    assert param_count(name, num_classes=10) == sum(p.numel() for p in model.parameters())


def test_param_counts_are_the_known_ones():
    assert param_count("resnet18") == 11_181_642  # torchvision resnet18 with a 10-class head
    assert param_count("resnet50", num_classes=1000, image_size=224) == 25_557_032
    assert 20_000 <= param_count("tiny") <= 50_000


def test_wide_cnn_has_its_documented_size_and_trains_a_step():
    """The time-to-accuracy sweep at 1 Gbit and its doc price the wide CNN's gradients at 1,129,866 parameters."""
    model = build_model("wide", num_classes=10, image_size=16)
    assert param_count("wide", num_classes=10, image_size=16) == sum(p.numel() for p in model.parameters()) == 1_129_866
    out = model(torch.randn(2, 3, 16, 16))
    assert out.shape == (2, 10)
    F.cross_entropy(out, torch.tensor([3, 7])).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_same_seed_same_init_and_global_rng_untouched():
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    a = build_model("tiny", seed=5).state_dict()
    assert torch.equal(torch.rand(1), expected_next)  # building a model did not consume the global stream
    b = build_model("tiny", seed=5).state_dict()
    c = build_model("tiny", seed=6).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["conv1.weight"], c["conv1.weight"])


def test_same_seed_same_resnet18():
    a, b = build_model("resnet18", seed=1), build_model("resnet18", seed=1)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_unknown_model_named_with_accepted_ones():
    with pytest.raises(ValueError, match="resnet19") as info:
        build_model("resnet19")
    assert all(name in str(info.value) for name in MODELS)
    with pytest.raises(ValueError, match="resnet19"):
        param_count("resnet19")


@pytest.mark.parametrize("name", MODELS)
def test_too_small_image_rejected(name):
    minimum = MIN_IMAGE_SIZE[name]
    with pytest.raises(ValueError, match=f"image_size {minimum - 1} is too small for {name}.*>= {minimum}"):
        build_model(name, image_size=minimum - 1)


def test_bad_num_classes_rejected():
    with pytest.raises(ValueError, match="num_classes must be an integer >= 1, got 0"):
        build_model("tiny", num_classes=0)


def test_threads_building_at_once_get_the_seeded_model():
    """Ranks that are threads of one process build concurrently: each still gets exactly its seed's model."""
    from concurrent.futures import ThreadPoolExecutor

    expected = build_model("tiny", seed=2).state_dict()
    with ThreadPoolExecutor(4) as pool:
        built = list(pool.map(lambda _: build_model("tiny", seed=2).state_dict(), range(8)))
    assert all(torch.equal(state[k], expected[k]) for state in built for k in expected)
