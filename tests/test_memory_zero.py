"""12.1.2 additions to the memory calculator: which ZeRO stage fits, and on how many devices."""
import pytest

from helpers import memory as M


def test_smallest_stage_for_13b_on_8_gpus_with_20_gb_of_activations():
    # per device: stage 0 208 GB, stage 1 71.5 GB, stage 2 48.75 GB, stage 3 26 GB; 60 GB are free
    assert [M.per_device_total(13e9, 8, s) / M.GB for s in range(4)] == [208, 71.5, 48.75, 26]
    assert M.smallest_stage_that_fits(13e9, 80e9, 8, reserve_bytes=20e9) == 2
    assert M.smallest_stage_that_fits(13e9, 80e9, 8) == 1  # with no activations 71.5 GB fits in 80
    assert M.smallest_stage_that_fits(1e9, 80e9, 8) == 0
    assert M.smallest_stage_that_fits(70e9, 80e9, 8, reserve_bytes=20e9) is None  # 140 GB at stage 3


def test_min_world_size_inverts_the_per_device_total():
    assert M.min_world_size_to_fit(70e9, 80e9, 3, reserve_bytes=20e9) == 19  # 16 x 70 / 60 = 18.7
    for stage in (1, 2, 3):
        m = M.min_world_size_to_fit(30e9, 80e9, stage, reserve_bytes=10e9)
        if m is None:
            continue
        assert M.per_device_total(30e9, m, stage) <= 70e9
        assert m == 1 or M.per_device_total(30e9, m - 1, stage) > 70e9


def test_min_world_size_stage_2_keeps_only_the_weights_whole():
    # bf16-mixed AdamW: 2 B weights + 2 B gradients + 12 B optimizer state per parameter; stage 2 keeps
    # the 2 B of weights whole and shards the other 14 B: 2 N + 14 N / M <= room
    assert M.min_world_size_to_fit(13e9, 80e9, 2) == 4  # 26 + 182/M <= 80: M >= 3.4
    assert M.min_world_size_to_fit(13e9, 80e9, 2, reserve_bytes=20e9) == 6  # 26 + 182/M <= 60: M >= 5.4
    # 30B in 70 GB: stage 1 keeps 120 GB whole (never fits); stage 2 60 + 420/M (M >= 42); stage 3 480/M (M >= 7)
    assert [M.min_world_size_to_fit(30e9, 80e9, s, reserve_bytes=10e9) for s in range(4)] == [None, None, 42, 7]


def test_min_world_size_none_when_the_unsharded_part_does_not_fit():
    assert M.min_world_size_to_fit(70e9, 80e9, 2, reserve_bytes=20e9) is None  # 2 B x 70B = 140 GB of weights
    assert M.min_world_size_to_fit(7.5e9, 80e9, 0) is None  # 120 GB whatever M
    assert M.min_world_size_to_fit(4e9, 80e9, 0) == 1
    assert M.min_world_size_to_fit(7.5e9, 80e9, 1) == 2  # 30 + 90/M GB <= 80


def test_the_books_max_model_examples():
    assert M.max_params_that_fit(80e9, 8, 0) == pytest.approx(5e9)
    assert M.max_params_that_fit(80e9, 8, 3) == pytest.approx(40e9)
    assert M.max_params_that_fit(80e9, 8, 0, reserve_bytes=30e9) == pytest.approx(3.125e9)
    assert M.max_params_that_fit(80e9, 8, 3, reserve_bytes=10e9) == pytest.approx(35e9)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: M.smallest_stage_that_fits(1e9, 80e9, 0), "world_size must be an integer >= 1"),
        (lambda: M.smallest_stage_that_fits(-1, 80e9, 8), "n_params must be a finite number > 0"),
        (lambda: M.smallest_stage_that_fits(1e9, 80e9, 8, reserve_bytes=80e9), "device_bytes > reserve_bytes"),
        (lambda: M.min_world_size_to_fit(1e9, 80e9, 4), "zero_stage must be 0, 1, 2 or 3"),
        (lambda: M.min_world_size_to_fit(1e9, 0, 3), "device_bytes > reserve_bytes"),
        (lambda: M.min_world_size_to_fit(1e9, 80e9, 3, precision="fp8"), "unknown precision"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()
