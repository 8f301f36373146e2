"""Which modules are the user's own code (dropped by a zygote forked from the driver, never
preloaded) and which are installed, wherever they are installed."""

import os
import sys
from types import SimpleNamespace

import pytest

from elastic_train._internal import env_vars
from elastic_train.worker import module_report, user_code


def module(name: str, path) -> SimpleNamespace:
    return SimpleNamespace(__name__=name, __file__=str(path))


def touch(path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")
    return str(path)


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A user's project directory, the working directory."""
    root = tmp_path / "project"
    root.mkdir()
    monkeypatch.chdir(root)
    return root


def test_the_users_modules_under_a_root_are_the_users(project):
    roots = (str(project),)
    assert user_code.is_user_code(module("model", touch(project / "model.py")), roots)
    assert user_code.is_user_code(module("pkg.data", touch(project / "pkg" / "data.py")), roots)


def test_site_directories_win_over_a_root_a_venv_inside_the_project(project):
    roots = (str(project),)
    for site in ("site-packages", "dist-packages"):
        path = touch(project / ".venv" / "lib" / "python3" / site / "lib_x" / "__init__.py")
        assert not user_code.is_user_code(module("lib_x", path), roots)


def test_a_site_directory_elsewhere_is_installed_pythonpath_or_pth(project, tmp_path):
    other_env = tmp_path / "other" / "lib" / "python3" / "site-packages"
    path = touch(other_env / "numpyish" / "__init__.py")
    assert not user_code.is_user_code(module("numpyish", path), (str(project), str(tmp_path)))


def test_a_target_directory_holding_dist_info_is_installed(project, monkeypatch):
    libs = project / "libs"  # pip install --target libs, inside the project
    (libs / "fancy-1.0.dist-info").mkdir(parents=True)
    path = touch(libs / "fancy" / "__init__.py")
    monkeypatch.syspath_prepend(str(libs))
    assert not user_code.is_user_code(module("fancy", path), (str(project),))
    # The same directory without installed distributions is the user's source tree.
    src = project / "src"
    mine = touch(src / "mine" / "__init__.py")
    monkeypatch.syspath_prepend(str(src))
    assert user_code.is_user_code(module("mine", mine), (str(project),))


def test_the_interpreters_prefix_is_installed_and_symlinks_are_resolved(project, tmp_path):
    assert not user_code.is_user_code(os, ("/",))
    # A module reached through a link in the project, stored in a site directory.
    real = touch(tmp_path / "store" / "site-packages" / "linked.py")
    os.symlink(real, project / "linked.py")
    assert not user_code.is_user_code(module("linked", project / "linked.py"), (str(project),))


def test_outside_every_root_is_installed(project, tmp_path):
    path = touch(tmp_path / "opt" / "thing" / "__init__.py")
    assert not user_code.is_user_code(module("thing", path), (str(project),))


def test_this_package_torch_and_fileless_modules_are_never_the_users(project):
    roots = ("/",)
    assert not user_code.is_user_code(module("torch.nn", touch(project / "torch" / "nn.py")),
                                      roots)
    assert not user_code.is_user_code(
        module("elastic_train.x", touch(project / "elastic_train" / "x.py")), roots)
    assert not user_code.is_user_code(SimpleNamespace(__name__="ns", __file__=None), roots)


def test_roots_working_directory_main_named_and_extra(project, tmp_path, monkeypatch):
    named = tmp_path / "named"
    monkeypatch.setenv(env_vars.USER_CODE, f"{named}{os.pathsep}")
    monkeypatch.setitem(sys.modules, "__main__", module("__main__", tmp_path / "bin" / "run.py"))
    roots = user_code.user_roots(extra=[str(tmp_path / "extra")])
    assert roots == (str(project), str(tmp_path / "bin"), str(named), str(tmp_path / "extra"))


def test_module_root_is_the_top_level_package(tmp_path):
    assert user_code.module_root(module("a.b.c", tmp_path / "a" / "b" / "c.py")) == \
        str(tmp_path / "a")
    assert user_code.module_root(module("a.b", tmp_path / "a" / "b" / "__init__.py")) == \
        str(tmp_path / "a")
    assert user_code.module_root(module("a", tmp_path / "a" / "__init__.py")) == \
        str(tmp_path / "a")
    assert user_code.module_root(module("train", tmp_path / "train.py")) == str(tmp_path)
    assert user_code.module_root(module("__main__", tmp_path / "s" / "run.py")) == \
        str(tmp_path / "s")
    assert user_code.module_root(None) is None


def test_a_worker_reports_installed_modules_only(project, monkeypatch):
    mine = module("my_layers", touch(project / "my_layers.py"))
    monkeypatch.setitem(sys.modules, "my_layers", mine)
    reported = module_report.installed_modules((str(project),))
    assert "my_layers" not in reported
    assert "os" in reported and "torch" in reported and "__main__" not in reported
