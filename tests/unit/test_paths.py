"""Path confinement on a real directory tree: resolved before the check, links and `..` included."""

import os

import pytest

from millm.kernel.model.paths import PathNotAllowed, PathPolicy, climbs, is_hub_id


@pytest.fixture
def tree(tmp_path):
    home, allowed, outside = tmp_path / "home", tmp_path / "allowed", tmp_path / "outside"
    for folder in (home, allowed, outside):
        folder.mkdir()
    (outside / "secret").write_text("no")
    (allowed / "sae").mkdir()
    os.symlink(outside / "secret", allowed / "link")
    model = tmp_path / "startup-model"
    model.mkdir()
    return tmp_path, PathPolicy(home, [allowed], model)


@pytest.mark.parametrize(
    "relative, ok",
    [
        ("home", True),
        ("home/not-yet-there", True),
        ("allowed/sae", True),
        ("startup-model", True),
        ("startup-model/config.json", True),
        ("outside/secret", False),
        ("outside/missing", False),
        ("allowed/link", False),  # a link inside leads outside
        ("allowed/../outside/secret", False),
        ("allowed-sibling", False),  # a prefix of the name is not the folder
        ("", False),
    ],
)
def test_local_paths(tree, relative, ok):
    root, policy = tree
    given = str(root / relative) if relative else "/"
    if ok:
        assert policy.local(given, "path").is_relative_to(root)
    else:
        with pytest.raises(PathNotAllowed) as refused:
            policy.local(given, "path")
        assert refused.value.status == 403 and refused.value.code == "path_not_allowed"


def test_the_refusal_reads_the_same_whether_the_file_exists(tree):
    root, policy = tree
    messages = []
    for name in ("secret", "missing"):
        with pytest.raises(PathNotAllowed) as refused:
            policy.local(str(root / "outside" / name), "path")
        messages.append(refused.value.message.replace(name, "X"))
    assert messages[0] == messages[1]


@pytest.mark.parametrize(
    "value, bad",
    [
        ("sae/layer_3", False),
        ("", False),
        ("../x", True),
        ("a/../../b", True),
        ("/etc", True),
        ("~/x", True),
        ("C:/x", True),
        ("a/..", True),
    ],
)
def test_paths_inside_a_repository_may_not_climb(value, bad):
    assert climbs(value) == bad


@pytest.mark.parametrize(
    "value, hub",
    [
        ("owner/name", True),
        ("Owner/na.me-1", True),
        ("owner/..", False),
        ("../name", False),
        ("./name", False),
        ("/a/b", False),
        ("a/b/c", False),
        ("name", False),
    ],
)
def test_hub_ids(value, hub):
    assert is_hub_id(value) == hub


def test_model_references(tree):
    root, policy = tree
    assert policy.model_reference(str(root / "allowed" / "sae")) is True  # local, inside
    # the demo ships with the package
    assert policy.model_reference("SmolLM2-135M-Instruct") is True
    assert policy.model_reference("owner/name") is False  # a hub id: looked up on the hub only
    with pytest.raises(PathNotAllowed):
        policy.model_reference(str(root / "outside"))
    with pytest.raises(PathNotAllowed):
        policy.model_reference("owner/../../etc")
