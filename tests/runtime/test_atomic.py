import os
import stat

from rlcore.runtime.atomic import publish, staging_dir, staging_file


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_published_entries_get_ordinary_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        file = staging_file(tmp_path / "data.parquet")
        file.write_text("x")
        publish(file, tmp_path / "data.parquet")
        folder = staging_dir(tmp_path / "global_step_1")
        publish(folder, tmp_path / "global_step_1")
    finally:
        os.umask(old)
    assert mode(tmp_path / "data.parquet") == 0o644  # tempfile alone would leave 0600
    assert mode(tmp_path / "global_step_1") == 0o755  # and 0700
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.parquet", "global_step_1"]
