"""Which profile file a name means, and which files are trusted."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpcdist.errors import ProfileError
from hpcdist.spec.profiles import PROFILE_DIR, load_profile, resolve_profile_path, trust_problem


@pytest.fixture
def config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    folder = tmp_path / "config" / "hpcdist" / "profiles"
    folder.mkdir(parents=True)
    return folder


@pytest.mark.parametrize("name", ["generic", "generic.yaml"])
def test_bare_name_is_shipped_never_the_current_folders(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config_home: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "generic.yaml").write_text("partition: planted\n")
    assert resolve_profile_path(name) == PROFILE_DIR / "generic.yaml"
    assert load_profile(name).partition != "planted"


def test_bare_name_of_the_users_config_folder(config_home: Path) -> None:
    (config_home / "mine.yaml").write_text("partition: p\n")
    assert load_profile("mine").partition == "p"
    assert load_profile("mine").source == str(config_home / "mine.yaml")


def test_file_only_in_the_current_folder_says_how_to_name_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config_home: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "site.yaml").write_text("partition: p\n")
    with pytest.raises(ProfileError, match=r"not a shipped profile .*write ./site.yaml"):
        resolve_profile_path("site.yaml")
    assert load_profile("./site.yaml").partition == "p"


@pytest.mark.parametrize(
    ("mode", "refused"), [(0o600, False), (0o644, False), (0o664, True), (0o646, True)]
)
def test_writable_profile_refused_unless_trusted(tmp_path: Path, mode: int, refused: bool) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("partition: p\n")
    path.chmod(mode)
    assert bool(trust_problem(path)) is refused
    if refused:
        with pytest.raises(ProfileError, match="pass --trust-profile if you trust it"):
            load_profile(str(path))
    assert load_profile(str(path), trust=True).partition == "p"


def test_shipped_profiles_need_no_check() -> None:
    assert trust_problem(PROFILE_DIR / "generic.yaml") == ""
    assert load_profile("generic").source == "shipped:generic.yaml"


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_profile_of_another_user_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("partition: p\n")
    os.chown(path, 65534, 65534)
    with pytest.raises(ProfileError, match="is owned by uid 65534"):
        load_profile(str(path))
