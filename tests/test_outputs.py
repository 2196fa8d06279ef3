"""outputs.remove_path: what stands where a run's file or folder goes is cleared, and a link
goes without what it points to."""
from __future__ import annotations

from mtbert.outputs import remove_path


def test_remove_path_clears_a_folder_a_file_or_a_link(tmp_path):
    kept = tmp_path / "kept"
    (kept / "sub").mkdir(parents=True)
    (kept / "sub" / "model.pt").write_text("weights")
    folder, file, link, dangling = (tmp_path / name for name in ("folder", "file", "link", "dangling"))
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "x").write_text("x")
    file.write_text("x")
    link.symlink_to(kept, target_is_directory=True)
    dangling.symlink_to(tmp_path / "gone")
    for path in (folder, file, link, dangling, tmp_path / "nothing"):
        remove_path(path)
        assert not path.exists() and not path.is_symlink(), path
    assert (kept / "sub" / "model.pt").read_text() == "weights"  # a link's target stays whole
