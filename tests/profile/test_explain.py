"""The profile's reading of Nsight Compute's CSV and its explanation in words (grader.profile),
on ncu output as it prints it for the reference and four students (tests/ncu_fixtures.py)."""

import pytest

from grader.profile import explain, ncu
from tests import ncu_fixtures as fx


def profile(launches):
    return ncu.parse(fx.ncu_csv(launches))


def findings(student):
    return explain.explain(profile(student), profile(fx.REFERENCE), fx.MUST_MOVE).findings


def test_parse_reads_every_figure_with_its_unit():
    (launch,) = profile(fx.READS_TWICE)
    assert launch.kernel == "softmax_two_pass"
    assert launch.figures["dram_read_bytes"] == 805_437_440  # "805,437,440": thousands separators read
    assert launch.figures["duration_ns"] == 391_030
    assert launch.figures["registers"] == 26 and launch.figures["block_size"] == 128
    assert launch.stalls["long_scoreboard"] == 24.0 and "membar" not in launch.stalls  # zero: not kept


def test_units_other_than_base_are_scaled():
    text = fx.ncu_csv(fx.REFERENCE).replace('"nsecond"', '"usecond"', 1)
    (launch,) = ncu.parse(text)
    assert launch.figures["duration_ns"] == 192_160 * 1e3


def test_the_correct_sample_has_no_gap_to_explain():
    said = findings(fx.CORRECT)
    assert said == ["your kernel takes 1.03x the reference's time under the profiler: no gap to explain"]


def test_a_kernel_that_reads_its_input_twice_moves_twice_the_bytes():
    said = findings(fx.READS_TWICE)
    assert said[0] == ("your kernel moves 2.0x the bytes the reference moves (1.07 GB against 537.00 MB; "
                       "the assignment must move 536.87 MB)")
    assert len(said) == 1  # its throughput is the reference's: nothing else to say


def test_a_block_of_one_warp_is_limited_by_blocks_per_sm():
    said = findings(fx.TINY_BLOCK)
    assert said[0].startswith("block size 32: occupancy limited by blocks per SM (32 blocks of 32 threads")
    assert "occupancy 45%" in said[0]
    assert said[1].startswith("your kernel reaches 41% of the memory system's peak throughput, the reference 89%")


def test_many_registers_limit_occupancy():
    said = findings(fx.MANY_REGISTERS)
    assert said[0] == "occupancy 12%: 255 registers per thread (the reference: 26, occupancy 86%)"
    assert "global memory loads" in said[1]  # where its few warps wait


def test_table_holds_the_numbers_behind_the_words():
    e = explain.explain(profile(fx.MANY_REGISTERS), profile(fx.REFERENCE), fx.MUST_MOVE)
    rows = {name: (mine, ref) for name, mine, ref in e.table}
    assert rows["registers per thread"] == ("255", "26")
    assert rows["occupancy limited by"] == ("registers", "warps")
    assert rows["duration"] == ("512.3 us", "192.2 us")
    assert rows["bytes the assignment must move"] == ("536.87 MB", "536.87 MB")
    assert rows["stall: long scoreboard (cycles per issue)"] == ("41.0", "21.4")
    assert e.ratio == pytest.approx(2.666, abs=1e-3)


def test_a_counter_permission_error_says_why_in_one_line():
    text = ("==PROF== Connected to process 77 (/usr/bin/python3)\n"
            "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance "
            "Counters on the target device 0. For instructions on enabling permissions and to get more "
            "information see https://developer.nvidia.com/ERR_NVGPUCTRPERM\n"
            "==PROF== Disconnected from process 77\n")
    with pytest.raises(ncu.NcuError) as err:
        ncu.parse(text)
    assert "NVreg_RestrictProfilingToAdminUsers=0" in str(err.value) and "\n" not in str(err.value)


def test_no_launch_profiled_is_an_error_not_an_empty_profile():
    with pytest.raises(ncu.NcuError, match="profiled no launch"):
        ncu.parse("==PROF== Connected to process 77\n==WARNING== No kernels were profiled.\n")


def test_a_hostile_kernel_name_is_shown_as_one_harmless_line():
    name = "k\x1b[2J\x1b]8;;http://evil\x07\nFAKE: all passed [bold red]x[/]" + "A" * 500
    launches = profile([(name, fx.BASE, fx.BASE_STALLS)])
    assert len(launches[0].kernel) <= 200
    e = explain.explain(launches, profile(fx.REFERENCE), fx.MUST_MOVE)
    shown = dict((n, m) for n, m, _ in e.table)["kernels"]
    assert "\x1b" not in shown and "\n" not in shown and "\x07" not in shown
    assert len(shown) <= 45
    assert all("\x1b" not in ln and "\n" not in ln for ln in explain.lines("softmax", e))


def test_a_ragged_or_garbled_row_is_skipped_not_a_crash():
    text = fx.ncu_csv(fx.REFERENCE + fx.CORRECT)
    head, units, first, second = [ln for ln in text.splitlines() if ln.startswith('"')]
    garbled = second.replace('"197,890"', '"nan-ish"')
    parsed = ncu.parse("\n".join([head, units, first + ',"extra"', garbled]))
    assert [x.kernel for x in parsed] == ["softmax"]  # the ragged row skipped
    assert "duration_ns" not in parsed[0].figures  # a figure that is not a number is left out


def test_options_filter_the_records_kernels_and_one_reps_launches():
    opts = ncu.options(["softmax", "soft.max(x)"], 3, "/out/ncu.csv")
    assert opts[opts.index("--kernel-name") + 1] == r"regex:^(soft\.max\(x\)|softmax)$"
    assert opts[opts.index("--launch-count") + 1] == "3"
    assert opts[opts.index("--log-file") + 1] == "/out/ncu.csv"
    assert "gpu__time_duration.sum" in opts[opts.index("--metrics") + 1].split(",")
    assert ncu.options(["k"], 10_000, "x")[ncu.options(["k"], 10_000, "x").index("--launch-count") + 1] == "64"


def test_counters_restricted_reads_the_drivers_parameter(tmp_path):
    params = tmp_path / "params"
    params.write_text("ResmanDebugLevel: 4294967295\nRmProfilingAdminOnly: 1\n")
    assert ncu.counters_restricted(params) is True
    params.write_text("RmProfilingAdminOnly: 0\n")
    assert ncu.counters_restricted(params) is False
    assert ncu.counters_restricted(tmp_path / "absent") is None


TWO_KERNELS = [("row_stats", {**fx.BASE, "duration_ns": 120_000, "dram_read_bytes": 268_566_528,
                              "dram_write_bytes": 262_144}, fx.BASE_STALLS),
               ("row_write", {**fx.BASE, "duration_ns": 185_000}, fx.BASE_STALLS)]


def test_two_kernels_that_read_the_input_twice_are_told_the_bytes_not_the_launch():
    said = findings(TWO_KERNELS)
    assert said == ["your kernel moves 1.5x the bytes the reference moves (805.83 MB against 537.00 MB; "
                    "the assignment must move 536.87 MB)"]


def test_many_short_launches_are_said():
    short = [(f"k{i}", {**fx.BASE, "duration_ns": 3_000, "dram_read_bytes": 1e6, "dram_write_bytes": 1e6},
              fx.BASE_STALLS) for i in range(8)]
    ref = [("k", {**fx.BASE, "duration_ns": 6_000, "dram_read_bytes": 8e6, "dram_write_bytes": 8e6}, fx.BASE_STALLS)]
    said = explain.explain(profile(short), profile(ref), None).findings
    assert said == ["your call makes 8 kernel launches, the reference's 1"]


def test_bytes_against_what_the_assignment_must_move_when_the_reference_has_none():
    no_dram = {k: v for k, v in fx.BASE.items()}
    ref = ncu.parse(fx.ncu_csv([("ref", no_dram, fx.BASE_STALLS)]))
    for launch in ref:
        launch.figures.pop("dram_read_bytes"), launch.figures.pop("dram_write_bytes")
    said = explain.explain(profile(fx.READS_TWICE), ref, fx.MUST_MOVE).findings
    assert said[0] == "your kernel moves 2.0x the bytes the assignment must move (1.07 GB against 536.87 MB)"


def test_ncus_own_output_on_a_gpu_is_read_whole():
    """ncu's real CSV (an H200's, tests/ncu_fixtures.H200_RAW): every figure the rules use is read,
    the duration in its base unit ("ns") too, and the stall reasons with it."""
    from tests.ncu_fixtures import H200_RAW

    from grader.profile import ncu

    (launch,) = ncu.parse(H200_RAW)
    assert launch.figures["duration_ns"] == 54816.0
    assert launch.figures["dram_write_bytes"] == 40017664.0 and launch.figures["registers"] == 44.0
    assert launch.figures["block_size"] == 256.0 and launch.figures["grid_size"] == 1056.0
    assert set(ncu.METRICS) <= set(launch.figures), sorted(set(ncu.METRICS) - set(launch.figures))
    assert launch.stalls["not_selected"] == 3.69 and len(launch.stalls) >= 8
