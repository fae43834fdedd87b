"""Every published size builds, and its parameter count is within 2% of the published one (at the class count the
figure was published for: 80 COCO classes for the detectors, 1000 ImageNet classes for the classifiers)."""

from __future__ import annotations

import pytest
import torch

from libreyolo.families import get_family, parse_model_name

# model name -> (published parameters, classes, where the figure is published)
YOLOV9 = "YOLOv9 paper (Wang et al. 2024, arXiv:2402.13616) and WongKinYiu/yolov9 README, performance table"
YOLOX = "YOLOX README (Megvii-BaseDetection/YOLOX), model zoo tables"
RTDETR = "RT-DETR README (lyuwenyu/RT-DETR), model zoo table"
RTDETR_CODE = "lyuwenyu/RT-DETR rtdetr_pytorch built at 80 classes (the README's 42M is rounded down from it)"
DFINE_CODE = "Peterande/D-FINE built at 80 classes, as LibreYOLO 1.6 builds it (its README rounds to 4M, 10M, 19M)"
TORCHVISION = "torchvision.models documentation (num_params of the IMAGENET1K_V1 weights)"
MNV4 = "MobileNetV4 paper (Qin et al. 2024, arXiv:2404.10518), ImageNet classification table"
RTMDET = "mmdetection's RTMDet README (configs/rtmdet), model zoo table"
RTMDET_CODE = "mmdetection's rtmdet_tiny config built at 80 classes, as LibreYOLO 1.6 counts it (its README: 4.8M)"
PUBLISHED: dict[str, tuple[float, int, str]] = {
    "LibreYOLO9m": (20.0e6, 80, YOLOV9),
    "LibreYOLO9c": (25.3e6, 80, YOLOV9),
    "LibreYOLOXn": (0.91e6, 80, YOLOX),
    "LibreYOLOXt": (5.06e6, 80, YOLOX),
    "LibreYOLOXs": (9.0e6, 80, YOLOX),
    "LibreYOLOXm": (25.3e6, 80, YOLOX),
    "LibreYOLOXl": (54.2e6, 80, YOLOX),
    "LibreYOLOXx": (99.1e6, 80, YOLOX),
    "LibreRTMDett": (4_896_168, 80, RTMDET_CODE),
    "LibreRTMDets": (8.89e6, 80, RTMDET),
    "LibreRTMDetm": (24.71e6, 80, RTMDET),
    "LibreRTMDetl": (52.3e6, 80, RTMDET),
    "LibreRTMDetx": (94.86e6, 80, RTMDET),
    "LibreRTDETRr18": (20e6, 80, RTDETR),
    "LibreRTDETRr34": (31e6, 80, RTDETR),
    "LibreRTDETRr50": (42_891_372, 80, RTDETR_CODE),
    "LibreRTDETRr101": (76e6, 80, RTDETR),
    "LibreDFINEn": (3_782_693, 80, DFINE_CODE),
    "LibreDFINEs": (10_321_877, 80, DFINE_CODE),
    "LibreDFINEm": (19_590_064, 80, DFINE_CODE),
    "LibreResNet18": (11_689_512, 1000, TORCHVISION),
    "LibreResNet34": (21_797_672, 1000, TORCHVISION),
    "LibreResNet50": (25_557_032, 1000, TORCHVISION),
    "LibreMNv4s": (3.8e6, 1000, MNV4),
    "LibreMNv4m": (9.7e6, 1000, MNV4),
    "LibreMNv4l": (32.4e6, 1000, MNV4),
}
# this project's YOLOv9-t and -s are smaller than the published ones (ADown downsamplers and ungrouped box towers
# where the published use AConv and grouped towers: 1.94M and 6.55M parameters); matching them changes the
# networks' compute, which is the lead's decision (issue 49's report), so these stay expected failures
NOT_YET = {"LibreYOLO9t": (2.0e6, 80, YOLOV9), "LibreYOLO9s": (7.1e6, 80, YOLOV9)}


def _count(name: str, nc: int) -> int:
    parsed = parse_model_name(name)
    assert parsed is not None, name
    fam, size = parsed
    return sum(p.numel() for p in fam.build(size, nc).parameters())


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_size_has_the_published_parameter_count(name):
    published, nc, source = PUBLISHED[name]
    n = _count(name, nc)
    assert abs(n - published) / published < 0.02, f"{name}: {n:,} parameters, published {published:,.0f} ({source})"


@pytest.mark.parametrize("name", sorted(NOT_YET))
@pytest.mark.xfail(strict=True, reason="our t/s differ from the published layout (see NOT_YET)")
def test_own_yolo9_sizes_against_the_published_count(name):
    published, nc, source = NOT_YET[name]
    assert abs(_count(name, nc) - published) / published < 0.02, source


def test_every_registered_size_is_covered():
    covered = set(PUBLISHED) | set(NOT_YET)
    for fam in ("yolo9", "yolox", "rtmdet", "rtdetr", "dfine", "resnet", "mnv4"):
        assert set(get_family(fam).models) <= covered, fam


@pytest.mark.parametrize("name", ["LibreYOLO9m", "LibreYOLO9c", "LibreYOLOXm", "LibreRTDETRr50"])
def test_new_detector_sizes_run_forward_on_a_small_image(name):
    parsed = parse_model_name(name)
    assert parsed is not None
    fam, size = parsed
    net = fam.build(size, 3).eval()
    with torch.no_grad():
        out = net(torch.rand(1, 3, 64, 64))
    boxes = fam.postprocess(net, out, (64, 64), 0.0, 0.7, 10)
    assert boxes.shape[1] == 7 and boxes.shape[0] > 0
