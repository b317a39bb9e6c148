"""Where Nsight Compute lies (grader.profile.ncu.locate): the `ncu` on PATH is the CUDA toolkit's
launcher script, and the folder it looks for is what a sandboxed replay must be shown."""

from __future__ import annotations

import os
import shutil
import subprocess

from grader.profile import ncu
from tests import ncu_fixtures as fx

BINARY = "#!/bin/sh\necho real ncu \"$@\"\n"


def test_the_launcher_is_followed_to_the_install_it_would_run(tmp_path, monkeypatch):
    launcher, install = fx.install_ncu(tmp_path, BINARY)
    monkeypatch.setattr(ncu, "OPT_ROOT", tmp_path / "nowhere")  # the machine's own /opt plays no part
    assert ncu.locate(launcher) == ncu.Install(install / "ncu", install)
    # the launcher itself runs that install (the control: the stand-in behaves as the real one)
    out = subprocess.run([str(launcher), "--version"], capture_output=True, text=True, timeout=30)
    assert out.stdout == "real ncu --version\n", out


def test_the_latest_version_of_both_places_wins_as_the_launcher_picks_it(tmp_path, monkeypatch):
    monkeypatch.setattr(ncu, "OPT_ROOT", tmp_path / "nowhere")
    launcher, older = fx.install_ncu(tmp_path, BINARY.replace("real", "2025.3.1"), "2025.3.1")
    _, newer = fx.install_ncu(tmp_path / "other", BINARY.replace("real", "2026.1.0"), "2026.1.0", beside_toolkit=True)
    os.rename(newer, launcher.parent.parent / newer.name)
    assert ncu.locate(launcher).folder == launcher.parent.parent / "nsight-compute-2026.1.0"
    out = subprocess.run([str(launcher)], capture_output=True, text=True, timeout=30)
    assert out.stdout == "2026.1.0 ncu\n", out  # the launcher's own choice
    shutil.rmtree(launcher.parent.parent / newer.name)
    assert ncu.locate(launcher).folder == older


def test_an_install_beside_the_toolkit_and_links_into_an_install(tmp_path, monkeypatch):
    monkeypatch.setattr(ncu, "OPT_ROOT", tmp_path / "nowhere")
    launcher, install = fx.install_ncu(tmp_path, BINARY, beside_toolkit=True)
    assert install.parent == launcher.parent.parent and ncu.locate(launcher).folder == install
    link = tmp_path / "bin" / "ncu"  # /usr/local/bin/ncu -> <install>/ncu, or the real binary itself
    link.parent.mkdir()
    link.symlink_to(install / "ncu")
    assert ncu.locate(link) == ncu.Install(install / "ncu", install)
    link.unlink()
    link.symlink_to(install / fx.PLATFORM / "ncu")
    assert ncu.locate(link) == ncu.Install(install / "ncu", install)


def test_a_launcher_whose_install_is_missing_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setattr(ncu, "OPT_ROOT", tmp_path / "nowhere")
    launcher, install = fx.install_ncu(tmp_path, BINARY)
    shutil.rmtree(install)
    (install.parent / "2025.3.1-old").mkdir()  # a folder that holds no install is none
    why = ncu.locate(launcher)
    assert isinstance(why, str) and "is a launcher script, and no Nsight Compute install" in why, why
    assert str(tmp_path / "cuda") in why and str(tmp_path / "opt" / "nvidia" / "nsight-compute") in why, why
    assert "/.." not in why, why  # "$CUDA_TOOLKIT_BIN_DIR"/../nsight-compute-*: the toolkit's folder, said once
    out = subprocess.run([str(launcher)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and "nsight-compute directory is not found" in out.stdout  # as the launcher says


def test_an_ncu_binary_of_its_own_is_run_from_its_folder(tmp_path):
    binary = tmp_path / "tools" / "ncu"
    binary.parent.mkdir()
    binary.write_bytes(b"\x7fELF" + bytes(64))
    binary.chmod(0o755)
    assert ncu.locate(binary) == ncu.Install(binary, binary.parent)
