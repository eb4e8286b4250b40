"""benchmarks/bounds.py: the bound arithmetic (pure, canned numbers)."""
import math

import pytest

from benchmarks import bounds


def test_ring_allreduce_bytes_and_link_floor():
    assert bounds.ring_allreduce_bytes(100, 1) == 0
    assert bounds.ring_allreduce_bytes(100, 2) == 100          # 2(n-1)/n = 1
    assert bounds.ring_allreduce_bytes(100, 4) == 150          # 2*3/4
    assert bounds.link_floor(125_000_000, 1e9, mtu=0) == 1.0   # 1 Gbit of payload in 1 s
    # 2 jobs of 2 ranks, 24 MiB of gradients each, 1 Gbit/s: 2 x 24 MiB per direction
    s = 24 << 20
    assert bounds.ring_floor(s, 2, 1e9, jobs=2, mtu=0) == pytest.approx(2 * s * 8 / 1e9)
    assert bounds.ring_floor(s, 8, 1e9, mtu=0) == pytest.approx(1.75 * s * 8 / 1e9)
    # in wire bytes (the default: the testbed's MTU, 1500): 1514 bytes per 1448 of payload
    assert bounds.ring_floor(s, 2, 1e9, jobs=2) == pytest.approx(2 * s * 1514 / 1448 * 8 / 1e9)


def test_the_link_floor_counts_whole_frames_at_the_testbeds_mtu():
    from benchmarks import testbed
    assert testbed.MTU == 1500            # the veths' kernel default: what the default is
    # N payload bytes in whole frames of 1448: ceil(N / 1448) frames of 1514 bytes on the wire
    for frames in (1, 7, 17_490):                                   # 17,490 frames: ~25 MB
        n = frames * 1448
        assert bounds.link_floor(n, 1e9) == pytest.approx(math.ceil(n / 1448) * 1514 * 8 / 1e9,
                                                          rel=1e-12)
        assert bounds.link_floor(n, 1e9, mtu=1500) == bounds.link_floor(n, 1e9)
    # a message that ends in a partial frame: its payload plus 66 bytes of headers per
    # frame, the last one's prorated (a stream's rate, as the simulator's) -- within one
    # frame's headers below the count frame by frame
    n = 25_324_584
    frames = n + math.ceil(n / 1448) * 66
    assert (frames - 66) * 8 / 1e9 <= bounds.link_floor(n, 1e9) <= frames * 8 / 1e9
    # payload only without framing; jumbo frames and the loopback's 64 KiB frames
    assert bounds.link_floor(n, 1e9, mtu=0) == pytest.approx(n * 8 / 1e9, rel=1e-12)
    assert bounds.link_floor(8948, 1e9, mtu=9000) == pytest.approx(9014 * 8 / 1e9, rel=1e-12)
    assert bounds.link_floor(65484, 1e9, mtu=65536) == pytest.approx(65550 * 8 / 1e9, rel=1e-12)
    assert bounds.wire_bytes(1448) == pytest.approx(1514) and bounds.wire_bytes(1448, 0) == 1448
    assert bounds.floor_label(1500) == "wire bytes at MTU 1500"
    assert bounds.floor_label(0) == "payload bytes (no framing)"


def test_the_simulator_and_the_bound_give_one_transfer_the_same_time():
    """One copy of the frame rule: the simulator's comm floor and its simulated
    transfer alone on the link equal the bound's link floor, at every MTU."""
    from horovod_prio.sim import wire
    from horovod_prio.sim.engine import JobSpec, LinkConfig, comm_floor, simulate
    from horovod_prio.sim.profiles import Layer, Profile
    grad = 25_324_584
    prof = Profile("one", (Layer("l", grad // 4, 0.0, 0.0),), 8)     # float32: 4 B/param
    for mtu in (0, 1500, 9000, 65536):
        link = LinkConfig(bandwidth=1e9 / 8, latency=0.0, cycle_time=0.0, topology="nic",
                          mtu=mtu)
        floor = bounds.ring_floor(grad, 2, 1e9, mtu=mtu)
        assert comm_floor(prof, 2, link) == pytest.approx(floor, rel=1e-12)
        # one step of one job with no compute: exactly the transfer
        step = simulate([JobSpec(prof, 2, 1)], "fifo", link).step_times(0)[0]
        assert step == pytest.approx(floor, rel=1e-9)
        assert link.wire_factor() == wire.wire_factor(mtu)


@pytest.mark.parametrize("call, needle", [
    (lambda: bounds.ring_allreduce_bytes(100, 0), "ranks must be an integer >= 1"),
    (lambda: bounds.ring_allreduce_bytes(-1, 2), "grad_bytes"),
    (lambda: bounds.link_floor(100, 0), "rate must be"),
    (lambda: bounds.ring_floor(100, 2, 1e9, jobs=0), "jobs must be"),
    (lambda: bounds.link_floor(100, 1e9, mtu=67), "mtu must be 0 .* got 67"),
    (lambda: bounds.link_floor(100, 1e9, mtu=1500.0), "mtu must be 0 .* got 1500.0"),
    (lambda: bounds.link_floor(-1, 1e9), "bytes must be"),
    (lambda: bounds.wire_bytes(float("inf")), "bytes must be"),
    (lambda: bounds.overlap_bound(-0.1, 0.2, 0.3), "forward time"),
    (lambda: bounds.overlap_ceiling(0.1, 0.2, 0.3, float("nan")), "base step"),
    (lambda: bounds.overlap_ceiling(0, 0, 0, 1.0), "no bound"),
    (lambda: bounds.capture(1.0, 0.9, 0), "bound must be"),
    (lambda: bounds.capture("1", 0.9, 0.5), "base must be"),
    (lambda: bounds.class1(1.0, 0), "alone step"),
    (lambda: bounds.aa_resolution([]), "at least one"),
    (lambda: bounds.aa_resolution([(1.0, 1.1, 1.2)]), "pair 0: expected"),
    (lambda: bounds.aa_resolution([(1.0, 1.1), (0, 1.0)]), "pair 1 A must be"),
])
def test_bad_inputs_are_named(call, needle):
    with pytest.raises(ValueError, match=needle):
        call()


def test_overlap_ceiling_is_the_measured_step_over_max_of_compute_and_comm():
    # MobileNetV2-like: forward 0.18, backward 0.37, comm 0.40, plain step 0.706
    c = bounds.overlap_ceiling(0.18, 0.37, 0.40, 0.706)
    assert c.bound_s == pytest.approx(0.55) and c.speedup == pytest.approx(0.706 / 0.55)
    # communication-bound: the link floor is the bound
    c = bounds.overlap_ceiling(0.1, 0.2, 0.5, 0.6)
    assert c.bound_s == 0.5 and c.speedup == pytest.approx(1.2)


def test_share_of_the_bound_captured():
    c = bounds.capture(base_s=1.0, ours_s=0.85, bound_s=0.75)
    assert c.share == pytest.approx(0.6) and c.headroom == pytest.approx(0.25)
    assert c.ratio == pytest.approx(1 / 0.85) and c.note == ""
    assert c.text() == "1.18x, 60% of the bound's gain"
    # slower than the baseline: a negative share
    assert bounds.capture(1.0, 1.05, 0.75).share == pytest.approx(-0.2)
    # better than the bound: reported, flagged
    c = bounds.capture(1.0, 0.7, 0.75)
    assert c.share == pytest.approx(1.2) and "beyond the bound" in c.note


def test_no_headroom_below_ten_percent():
    c = bounds.capture(base_s=1.0, ours_s=0.97, bound_s=0.95)       # 5 % headroom
    assert c.share is None and c.headroom == pytest.approx(0.05)
    assert c.note.startswith("no headroom (5%")
    assert c.text().startswith("1.03x, no headroom")
    assert bounds.capture(1.0, 0.97, 0.90).share == pytest.approx(0.3)   # exactly 10 %: kept
    c = bounds.capture(1.0, 0.9, 1.1)                                # bound above the base
    assert c.share is None and c.headroom < 0
    assert bounds.capture(1.0, 0.97, 0.95, min_headroom=0.01).share == pytest.approx(0.6)


def test_class1_against_its_alone_time():
    d = bounds.class1(shared_s=0.42, alone_s=0.40)
    assert d == {"vs_alone": pytest.approx(1.05)}
    d = bounds.class1(shared_s=0.44, alone_s=0.40, base_s=0.60)       # plain Horovod: 1.5x
    assert d["vs_alone"] == pytest.approx(1.1)
    assert d["capture"].share == pytest.approx(0.8)


def test_aa_resolution_from_paired_repeats():
    r = bounds.aa_resolution([(1.00, 1.02), (0.50, 0.49), (2.0, 2.0), (1.0, 0.95)])
    assert r.pairs == 4
    assert r.diffs == pytest.approx((0.02, -0.02, 0.0, -0.05))
    assert r.median == pytest.approx(0.02) and r.max == pytest.approx(0.05)
    runs = [1.0, 1.02, 0.5, 0.49, 2.0, 2.0, 1.0, 0.95]
    mean = sum(runs) / len(runs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in runs) / (len(runs) - 1))
    assert r.cv == pytest.approx(sd / mean)
    assert r.text() == "A/A resolution over 4 pair(s): median 2.0%, max 5.0%, cv " + \
        f"{sd / mean:.1%}"
    one = bounds.aa_resolution([(1.0, 1.1)])
    assert one.median == one.max == pytest.approx(0.1) and one.cv is None


def test_report_cells_show_ratio_and_share_side_by_side():
    from benchmarks import report
    assert report.bound_cells(1.0, 0.85, 0.75) == ("1.18×", "60%")
    assert report.bound_cells(1.0, 0.97, 0.95) == ("1.03×", "no headroom (5%)")
    assert report.aa_line([(1.0, 1.02), (1.0, 0.99)]).startswith(
        "A/A resolution over 2 pair(s): median 1.5%, max 2.0%")


def test_per_layer_bound_by_hand():
    # input side first; per layer: forward, backward, link time of its gradient
    fwd, bwd = [0.1, 0.1, 0.1], [0.2, 0.2, 0.2]
    # layer 0: its own 0.01 s of link + the whole step's compute (0.9 s)
    # layer 2 (output side, 0.9 s of link): all 0.92 s of link + its own 0.3 s of compute
    assert bounds.per_layer_bound(fwd, bwd, [0.01, 0.01, 0.9]) == pytest.approx(1.22)
    # the input-side layer decides when its gradient is large
    assert bounds.per_layer_bound(fwd, bwd, [0.5, 0.01, 0.01]) == pytest.approx(1.4)
    # a layer without a gradient waits for nothing: not a candidate (0.3 + 0.1 for layer 1,
    # not 0 + 0.6 for layer 0)
    assert bounds.per_layer_bound([0.1, 0.1], [0.2, 0.2], [0.0, 0.1]) == pytest.approx(0.4)
    # in the middle: 0.51 s of link up to it, forward + backward of layers 1 and 2
    # (layer 0: 0.01 + 0.9)
    assert bounds.per_layer_bound(fwd, bwd, [0.01, 0.5, 0.0]) == pytest.approx(1.11)
    assert bounds.per_layer_bound([0.1], [0.2], [0.0]) == 0.0


def test_layer_bound_splits_the_measured_totals_by_the_profile():
    # (parameters, forward s, backward s): times add up to 10, scaled to 0.5 s of compute;
    # 0.4 s of link split 1:0:3 by parameters -> link (0.1, 0, 0.3),
    # forward (0.05, 0.05, 0.1), backward (0.1, 0.05, 0.15)
    layers = [(100, 1, 2), (0, 1, 1), (300, 2, 3)]
    # layer 0: 0.1 + 0.5; layer 2: 0.4 + 0.25
    assert bounds.layer_bound(layers, 0.5, 0.4) == pytest.approx(0.65)
    assert bounds.layer_bound(layers, 1.0, 0.4) == pytest.approx(1.1)      # layer 0: 0.1 + 1.0
    # never below the link floor plus the output-side layer's own compute
    assert bounds.layer_bound([(1, 1, 1), (1, 1, 1)], 0.2, 1.0) == pytest.approx(1.1)


@pytest.mark.parametrize("call, field", [
    (lambda: bounds.per_layer_bound([0.1], [0.2, 0.2], [0.1]), "one entry per layer"),
    (lambda: bounds.per_layer_bound([0.1], [-0.2], [0.1]), r"backward_s\[0\]"),
    (lambda: bounds.per_layer_bound([0.1], [0.2], [float("nan")]), r"link_s\[0\]"),
    (lambda: bounds.per_layer_bound(0.1, [0.2], [0.1]), "forward_s must be a sequence"),
    (lambda: bounds.layer_bound([], 0.5, 0.4), "no layers"),
    (lambda: bounds.layer_bound([(0, 1, 1)], 0.5, 0.4), "no layer has parameters"),
    (lambda: bounds.layer_bound([(1, 0, 0)], 0.5, 0.4), "all 0"),
    (lambda: bounds.layer_bound([(1, 1)], 0.5, 0.4), r"layers\[0\]"),
    (lambda: bounds.layer_bound([(1, 1, 1)], -0.5, 0.4), "compute time"),
    (lambda: bounds.layer_bound([(1, 1, 1)], 0.5, None), "link floor"),
])
def test_per_layer_bounds_name_bad_inputs(call, field):
    with pytest.raises(ValueError, match=field):
        call()
