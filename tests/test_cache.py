"""Image caches (data/cache.py): byte-identical batches, staleness, memory refusal, sharing and cleanup."""

import os
import pickle
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from libreyolo.data import diskcache
from libreyolo.data.cache import estimate_bytes, open_image_cache, ram_refusal
from libreyolo.data.config import list_images, load_data_config
from libreyolo.data.dataset import AugmentConfig, YOLODataset
from libreyolo.data.decode import load_resized, reduction
from libreyolo.data.labels import scan_labels
from libreyolo.data.loader import train_loader, val_loader


@pytest.fixture
def shm(tmp_path, monkeypatch):
    """A private stand-in for /dev/shm, so tests never see (or sweep) another process's RAM caches."""
    d = tmp_path / "shm"
    d.mkdir()
    monkeypatch.setenv("LIBREYOLO_SHM_DIR", str(d))
    return d


def _copy(tiny_data, tmp_path):
    root = tmp_path / "ds"
    shutil.copytree(tiny_data.parent, root)
    return root


def _labels(root, split="train"):
    dc = load_data_config(root / "data.yaml")
    return scan_labels(list_images(getattr(dc, split)), dc.nc, use_cache=False)


def _batches(ls, imgsz, source, workers):
    ds = YOLODataset(ls, imgsz, True, AugmentConfig(), seed=0, image_source=source)
    dl = train_loader(ds, 4, workers, seed=0, pin=False)
    out = []
    for epoch, mosaic in ((0, True), (1, False)):
        dl.batch_sampler.set_epoch(epoch, mosaic)
        out += list(dl)
    vds = YOLODataset(ls, imgsz, False, image_source=source)
    out += list(val_loader(vds, 8, workers, pin=False))
    return out


def test_cache_modes_and_worker_counts_give_byte_identical_batches(tiny_data, tmp_path, shm):
    # imgsz 32 on 64 px JPEGs: the reduced-scale decode and the resize are both on the path
    root = _copy(tiny_data, tmp_path)
    ls = _labels(root)
    assert reduction(max(ls.shapes[0]), 32) == 2
    reference = _batches(ls, 32, None, 0)
    for mode in ("disk", "ram"):
        notes: list[str] = []
        src = open_image_cache(mode, ls, 32, "train", notes, progress=False)
        assert src.mode == mode and notes == []
        for i in range(len(ls)):  # every image is served by the cache, not by the decode fallback
            img = src.get(i)
            assert img is not None and np.array_equal(img, load_resized(str(ls.files[i]), 32, max(ls.shapes[i])))
        for workers in (0, 2):
            got = _batches(ls, 32, src, workers)
            assert len(got) == len(reference)
            for a, b in zip(got, reference):
                assert torch.equal(a["img"], b["img"]) and torch.equal(a["targets"], b["targets"]), (mode, workers)
        src.close()


def test_cache_auto_fills_as_the_loader_decodes_and_serves_the_same_batches(tiny_data, tmp_path, shm, monkeypatch):
    """The default: a RAM cache made empty, filled by the loader's forked workers as they first decode each image
    (no decoding before training), then read: byte-identical batches before, while and after it fills."""
    from libreyolo.config import TrainConfig
    from libreyolo.data import dataset as dataset_mod

    assert TrainConfig().cache == "auto"
    ls = _labels(_copy(tiny_data, tmp_path))
    reference = _batches(ls, 32, None, 0)
    decoded: list[int] = []
    real = dataset_mod.load_resized
    monkeypatch.setattr(dataset_mod, "load_resized", lambda *a: decoded.append(1) or real(*a))
    src = open_image_cache("auto", ls, 32, "train", [], progress=False)
    assert src.mode == "ram" and decoded == [] and all(src.get(i) is None for i in range(len(ls)))
    for a, b in zip(_batches(ls, 32, src, 2), reference, strict=True):  # the workers fill it
        assert torch.equal(a["img"], b["img"]) and torch.equal(a["targets"], b["targets"])
    for i in range(len(ls)):
        img = src.get(i)
        assert img is not None and np.array_equal(img, load_resized(str(ls.files[i]), 32, max(ls.shapes[i])))
        assert not img.flags.writeable  # the mapping is writable, a view handed out is not
    monkeypatch.setattr(dataset_mod, "load_resized", lambda *a: pytest.fail("decoded an image the cache holds"))
    for a, b in zip(_batches(ls, 32, src, 0), reference, strict=True):
        assert torch.equal(a["img"], b["img"]) and torch.equal(a["targets"], b["targets"])
    src.close()
    assert not list(shm.glob("*.bin"))


def test_cache_auto_stores_an_image_only_where_shm_has_room_for_it(tiny_data, tmp_path, shm, monkeypatch):
    """put() writes an image into the file (pwrite), not into the mapping: where /dev/shm is full (ENOSPC, or a
    short write) the image is decoded and not stored, never a SIGBUS; once there is room it is stored."""
    import errno

    from libreyolo.data import ramcache

    if not hasattr(os, "pwrite"):
        pytest.skip("no pwrite here (Windows): the cache file is on disk and stores through the mapping")
    ls = _labels(_copy(tiny_data, tmp_path))
    src = open_image_cache("auto", ls, 64, "train", [], progress=False)
    ds = YOLODataset(ls, 64, False, image_source=src)
    real = os.pwrite
    writes: list[tuple[int, int]] = []

    def full(fd, data, off):
        writes.append((off, memoryview(data).nbytes))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ramcache.os, "pwrite", full)
    img, _ = ds.load(3)
    assert src.get(3) is None and writes == [(int(src._index[3, 0]), img.nbytes)]
    monkeypatch.setattr(ramcache.os, "pwrite", lambda fd, data, off: real(fd, bytes(data)[:100], off))  # short
    ds.load(3)
    assert src.get(3) is None
    monkeypatch.setattr(ramcache.os, "pwrite", real)
    ds.load(3)
    assert np.array_equal(src.get(3), load_resized(str(ls.files[3]), 64, max(ls.shapes[3])))
    src.close()


def test_a_cache_file_of_another_version_is_replaced_not_used(tiny_data, tmp_path, shm):
    """A file at the cache's path that an older version wrote (or a torn copy) is deleted and made again: the run
    fills the new one, and no image is read from the old bytes."""
    ls = _labels(_copy(tiny_data, tmp_path))
    first = open_image_cache("auto", ls, 64, "train", [], progress=False)
    ds = YOLODataset(ls, 64, False, image_source=first)
    for i in range(len(ls)):
        ds.load(i)
    assert all(first.get(i) is not None for i in range(len(ls)))
    path, filled = first.path, bytearray(first.path.read_bytes())
    first.close()
    assert not path.exists()
    at = filled.rindex(b"LYRAMF03")
    filled[at : at + 8] = b"LYRAMF02"  # the same images and index, an older version's magic
    path.write_bytes(bytes(filled))
    src = open_image_cache("auto", ls, 64, "train", [], progress=False)
    assert src.path == path and src.built and all(src.get(i) is None for i in range(len(ls)))
    YOLODataset(ls, 64, False, image_source=src).load(2)
    assert np.array_equal(src.get(2), load_resized(str(ls.files[2]), 64, max(ls.shapes[2])))
    src.close()
    assert not path.exists()


def test_cache_ram_after_cache_auto_fills_the_rest_and_calls_no_image_bad(tiny_data, tmp_path, shm):
    """A file cache=auto made (a run still using it, or one that crashed) is reused by cache=ram: the images not
    stored yet are filled as they are decoded, not reported as undecodable."""
    ls = _labels(_copy(tiny_data, tmp_path))
    auto = open_image_cache("auto", ls, 64, "train", [], progress=False)
    notes: list[str] = []
    ram = open_image_cache("ram", ls, 64, "train", notes, progress=False)
    assert not ram.built and ram.path == auto.path and ram.fill and notes == [] and ram.bad == []
    assert auto.filled() == 0
    YOLODataset(ls, 64, False, image_source=ram).load(6)
    assert np.array_equal(auto.get(6), load_resized(str(ls.files[6]), 64, max(ls.shapes[6])))
    assert auto.filled() == ram.filled() == 1  # what the profiler reports of a cache being filled
    ram.close()
    auto.close()


def test_cache_auto_takes_at_most_a_quarter_of_the_memory(tmp_path):
    from libreyolo.data.cache import auto_refusal

    gb = 10**9
    assert auto_refusal(3 * gb, tmp_path, available=60 * gb, total=16 * gb) is None
    why = auto_refusal(5 * gb, tmp_path, available=60 * gb, total=16 * gb)
    assert "needs 5.00 GB, more than a quarter of this machine's 16.00 GB" in why
    assert "4.29 GB must stay free" in auto_refusal(3 * gb, tmp_path, available=6 * gb, total=16 * gb)


def test_ram_cache_is_one_shared_file_removed_by_its_last_user(tiny_data, tmp_path, shm):
    root = _copy(tiny_data, tmp_path)
    ls = _labels(root)
    orphan = shm / "libreyolo-ram-0123456789abcdef0123.bin"  # left by a run that crashed
    orphan.write_bytes(b"x" * 1000)
    notes: list[str] = []
    a = open_image_cache("ram", ls, 64, "train", notes, progress=False)
    assert a.built and not orphan.exists() and any(str(orphan) in n for n in notes)
    assert a.filled() is None  # built before training: not being filled
    b = open_image_cache("ram", ls, 64, "train", [], progress=False)  # a second rank on the host maps it
    assert not b.built and b.path == a.path
    assert np.array_equal(a.get(5), b.get(5)) and not a.get(5).flags.writeable
    # a spawned worker receives the file's name, not its pixels
    clone = pickle.loads(pickle.dumps(a))
    assert len(pickle.dumps(a)) < 2000 and np.array_equal(clone.get(3), a.get(3))
    files = sorted(p.name for p in shm.glob("*.bin"))
    assert files == [a.path.name]
    a.close()
    assert a.path.exists()  # b still uses it
    b.close()
    assert not a.path.exists()


def test_stale_disk_entries_are_rebuilt(tiny_data, tmp_path):
    root = _copy(tiny_data, tmp_path)
    ls = _labels(root)
    first = open_image_cache("disk", ls, 64, "train", [], progress=False)
    assert first.written == len(ls) and first.reused == 0
    entry = Path(first.entries[0])
    assert entry.parent == ls.files[0].parent and entry.name == ls.files[0].name + ".64.npy"
    again = open_image_cache("disk", ls, 64, "train", [], progress=False)
    assert again.written == 0 and again.reused == len(ls)
    # a changed image (new pixels, new mtime) and a touched one are rebuilt; the others are kept
    changed, touched = ls.files[2], ls.files[7]
    cv2.imwrite(str(changed), 255 - cv2.imread(str(changed)))
    st = os.stat(touched)
    os.utime(touched, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    ls = _labels(root)  # a run scans the images (and stamps them) before it opens the cache
    third = open_image_cache("disk", ls, 64, "train", [], progress=False)
    assert third.written == 2 and third.reused == len(ls) - 2
    assert np.array_equal(third.get(2), load_resized(str(changed), 64, max(ls.shapes[2])))
    # another imgsz is a different entry
    other = open_image_cache("disk", ls, 32, "train", [], progress=False)
    assert other.written == len(ls) and max(other.get(0).shape[:2]) == 32


def test_disk_cache_goes_to_the_user_cache_folder_when_images_are_read_only(tiny_data, tmp_path, monkeypatch):
    root = _copy(tiny_data, tmp_path)
    ls = _labels(root)
    monkeypatch.setattr(diskcache, "_writable", lambda folder: False)
    src = open_image_cache("disk", ls, 64, "train", [], progress=False)
    entry = Path(src.entries[0])
    assert entry.is_file() and Path(os.environ["LIBREYOLO_CACHE"]) in entry.parents
    assert not list((root / "images" / "train").glob("*.npy"))


def test_memory_estimate_refuses_an_impossible_ram_cache(tiny_data, tmp_path, shm):
    root = _copy(tiny_data, tmp_path)
    ls = _labels(root)
    assert estimate_bytes([(480, 640)], 640) == 640 * 482 * 3  # two spare rows per image for rounding
    why = ram_refusal(50 * 10**9, shm, available=8 * 10**9, total=16 * 10**9)
    assert "needs 50.00 GB" in why and "8.00 GB of memory is available" in why and "4.29 GB must stay free" in why
    notes: list[str] = []
    src = open_image_cache("ram", ls, 64, "train", notes, available=2 * 10**9, progress=False)
    assert src.mode == "disk"  # fell back, and said so with the numbers
    assert len(notes) == 1 and "cache=ram for the train images (imgsz 64)" in notes[0]
    assert "2.00 GB of memory is available" in notes[0] and "caching on disk instead" in notes[0]
    assert not list(shm.glob("*.bin"))
    # cache=auto: RAM when it fits, else no cache at all (nothing written beside the images)
    notes = []
    assert (
        open_image_cache(
            "auto", _labels(_copy(tiny_data, tmp_path / "b")), 64, "train", notes, available=2 * 10**9, progress=False
        )
        is None
    )
    assert (
        len(notes) == 1
        and "cache=auto for the train images" in notes[0]
        and "training without an image cache" in notes[0]
    )
    auto = open_image_cache("auto", ls, 64, "train", [], progress=False)
    assert auto.mode == "ram"
    auto.close()


def test_images_that_fail_to_decode_while_caching_are_named_and_fall_back(tiny_data, tmp_path, shm):
    root = _copy(tiny_data, tmp_path)
    ls = _labels(root)
    victim = ls.files[4]
    victim.write_bytes(victim.read_bytes()[:40])  # broken after the label scan
    for mode in ("ram", "disk"):
        notes: list[str] = []
        src = open_image_cache(mode, ls, 64, "train", notes, progress=False)
        assert src.get(4) is None and any(str(victim) in n and "could not be decoded" in n for n in notes), mode
        ds = YOLODataset(ls, 64, True, AugmentConfig(), seed=0, image_source=src)
        out = ds[(4, 0, False)]
        assert out["bad"] == [str(victim)] and out["index"] == 5  # the per-sample fallback still works
        src.close()


def _open_in_child(ls, results, done):
    src = open_image_cache("ram", ls, 64, "train", [], progress=False)
    results.put((src.built, str(src.path), src.get(3).tobytes()))
    done.wait(60)  # hold the cache until the parent has looked
    src.close()


def test_processes_of_one_host_build_the_ram_cache_once(tiny_data, tmp_path, shm):
    import multiprocessing as mp

    ls = _labels(_copy(tiny_data, tmp_path))
    ctx = mp.get_context("fork")  # as DDP ranks would, two processes ask for the same cache at once
    results, done = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_open_in_child, args=(ls, results, done), daemon=True) for _ in range(2)]
    for p in procs:
        p.start()
    try:
        got = [results.get(timeout=60) for _ in procs]
        assert sorted(g[0] for g in got) == [False, True] and got[0][1:] == got[1][1:]
        assert len(list(shm.glob("*.bin"))) == 1
    finally:
        done.set()
        for p in procs:
            p.join(60)
            if p.is_alive():  # a hung child must fail this test, not hang the whole session
                p.kill()
    assert [p.exitcode for p in procs] == [0, 0]
    assert not list(shm.glob("*.bin"))


def test_a_full_shm_during_the_build_falls_back_to_disk(tiny_data, tmp_path, shm, monkeypatch):
    import errno

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full, raising=False)
    ls = _labels(_copy(tiny_data, tmp_path))
    notes: list[str] = []
    src = open_image_cache("ram", ls, 64, "train", notes, progress=False)
    assert src.mode == "disk" and "No space left on device" in notes[0] and "caching on disk instead" in notes[0]
    assert not list(shm.glob("libreyolo-ram-*.bin*"))  # no partial file left behind


def test_two_cpu_ranks_share_one_ram_cache_and_remove_it(tiny_data, tmp_path, shm):
    """DDP (2 Gloo ranks on CPU): both ranks train from the same RAM caches, which are gone after the run.
    Run as a command, so the launcher's processes (and multiprocessing's resource tracker) stay out of pytest."""
    import subprocess
    import sys

    from libreyolo.events import read_events
    from libreyolo.launch import CPU_WORLD_ENV, SPAWNED_ENV

    root = _copy(tiny_data, tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", SPAWNED_ENV)}
    env[CPU_WORLD_ENV] = "2"
    project = tmp_path / "runs"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "libreyolo.cli.main",
            "train",
            f"data={root / 'data.yaml'}",
            f"project={project}",
            "epochs=1",
            "imgsz=64",
            "batch=4",
            "workers=0",
            "device=cpu",
            "cache=ram",
            "val=false",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    run = project / "exp"
    events = list(read_events(run / "events.jsonl"))
    assert events[0]["world_size"] == 2 and events[-1]["status"] == "finished"
    warnings = [e["message"] for e in events if e["type"] == "warning"]
    assert not [w for w in warnings if "cache=" in w or "while caching" in w], (
        warnings
    )  # no fallback, nothing undecodable
    assert not list(shm.glob("*.bin*"))
    # one key per split, used by both ranks (each key has its users' lock file)
    assert len(list(shm.glob("libreyolo-ram-*.build.lock"))) == 2
