"""Checks of a job against the machine, before Ray starts, all reported in one pass."""

import errno
import os
import shutil

import pytest

from rlcore import cli
from rlcore.config import load_job
from rlcore.errors import ConfigError
from rlcore.plugins.manager import PluginManager


def write_parquet(path, **columns):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), path)
    return path


@pytest.fixture
def data(tmp_path):
    return write_parquet(tmp_path / "train.parquet", prompt=[[{"role": "user", "content": "1 + 1?"}]],
                         data_source=["openai/gsm8k"], reward_model=[{"ground_truth": "2"}])


def problems(overrides, tmp_path) -> str:
    with pytest.raises(ConfigError) as info:
        load_job(None, [f"trainer.default_local_dir='{tmp_path / 'run'}'", *overrides],
                 manager=PluginManager(autoload=False), machine=True)
    return str(info.value)


def test_an_empty_job_is_refused_by_validate_as_train_refuses_it(capsys):
    assert cli.main(["config", "validate"]) == 2
    assert "data.train_files: no training data given" in capsys.readouterr().err


def test_problems_of_files_folders_and_keys_come_together(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    message = problems([f"data.train_files=['{tmp_path / 'missing.parquet'}']", f"model.path='{tmp_path / 'model'}'",
                        f"critic.model.path='{tmp_path / 'broken'}'", "trainer.resume_mode='/no/such/step'",
                        "trainer.default_local_dir='runs/{project}'", "actor.ppo_mini_batch_size=7"], tmp_path)
    for expected in ("data.train_files[0] = ", "missing.parquet': no such file or folder",
                     "model.path = ", "the folder has no config.json",
                     "critic.model.path = ", "config.json is not valid JSON",
                     "trainer.resume_mode = '/no/such/step': not a checkpoint folder",
                     "trainer.default_local_dir = 'runs/{project}': only {project_name} and {experiment_name}",
                     "must be a multiple of actor.ppo_mini_batch_size (7)"):
        assert expected in message
    assert "7 problems" in message


def test_a_run_folder_that_is_a_file_is_named(tmp_path, data):
    (tmp_path / "run").write_text("")
    assert "is a file, not a folder" in problems([f"data.train_files=['{data}']"], tmp_path)


def test_a_read_only_output_folder_is_found_before_anything_starts(tmp_path, data, monkeypatch):
    folder = tmp_path / "ro"
    folder.mkdir()
    os.chmod(folder, 0o555)
    try:
        probe = folder / "probe"
        probe.touch()  # root ignores the mode bits: simulate the refusal a read-only mount gives
        probe.unlink()
        real_open = os.open

        def read_only(path, flags, *args):
            if str(path).startswith(str(folder)) and flags & os.O_CREAT:
                raise PermissionError(errno.EROFS, "Read-only file system", str(path))
            return real_open(path, flags, *args)

        monkeypatch.setattr(os, "open", read_only)
    except PermissionError:
        pass  # not root: the mode bits are enforced
    try:
        with pytest.raises(ConfigError, match=r"trainer.default_local_dir \(.*ro/run\) is not writable"):
            load_job(None, [f"trainer.default_local_dir='{folder / 'run'}'", f"data.train_files=['{data}']"],
                     manager=PluginManager(autoload=False), machine=True)
    finally:
        os.chmod(folder, 0o755)


def test_free_space_is_checked_against_one_checkpoint(tmp_path, data, monkeypatch):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"\0" * 1000)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**6, 10**6 - 2000, 2000))
    message = problems([f"data.train_files=['{data}']", f"model.path='{model}'", "trainer.save_freq=1"], tmp_path)
    assert "GiB free, less than one checkpoint needs" in message


def test_a_job_file_that_is_not_utf8_is_one_message(tmp_path):
    path = tmp_path / "job.toml"
    path.write_bytes(b"[actor]\nname = \"\xff\xfe\"\n")
    with pytest.raises(ConfigError, match=r"job.toml is not UTF-8 text \(byte 16"):
        load_job(path, [], manager=PluginManager(autoload=False))


@pytest.mark.parametrize("text", ["actor..clip_ratio=0.3", ".actor.clip_ratio=0.3", "actor.clip_ratio.=0.3"])
def test_a_key_with_an_empty_part_is_malformed_not_an_unknown_section(text):
    with pytest.raises(ConfigError, match=r"malformed key .* \(an empty name between dots\)"):
        load_job(None, [text], manager=PluginManager(autoload=False))


def _installed(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False


@pytest.mark.skipif(_installed("vllm") or _installed("megatron"), reason="needs an environment without vllm and "
                    "megatron-core (the main test environment)")
def test_missing_engine_backend_and_tracker_libraries_are_found_with_the_files(tmp_path, capsys, monkeypatch):
    import rlcore.runs.preflight

    # a tracker library missing here as well: wandb is in the test extra, so its lookup is made to fail
    real = rlcore.runs.preflight.missing_modules
    monkeypatch.setattr(rlcore.runs.preflight, "missing_modules",
                        lambda obj: ["wandb"] if getattr(obj, "requires", ()) == ("wandb",) else real(obj))
    job = [f"data.train_files=['{tmp_path / 'missing.parquet'}']", "rollout.name='vllm'", "trainer.backend='megatron'",
           "trainer.logger=['console','wandb']", f"trainer.default_local_dir='{tmp_path / 'run'}'"]
    assert cli.main(["config", "validate", *job]) == 2
    err = capsys.readouterr().err
    for line in ("rollout.name = 'vllm': vllm is not installed (pip install 'rlcore[vllm]')",
                 "trainer.backend = 'megatron': megatron.core is not installed (pip install 'rlcore[megatron]')",
                 "trainer.logger[1] = 'wandb': wandb is not installed (pip install 'rlcore[wandb]')",
                 f"data.train_files[0] = '{tmp_path / 'missing.parquet'}': no such file or folder"):
        assert line in err, err
    # --keys-only: a job written for another machine, whose files and libraries are there
    assert cli.main(["config", "validate", "--keys-only", *job]) == 0
    assert "OK (keys only: files, folders and libraries not checked)" in capsys.readouterr().out


@pytest.mark.skipif(_installed("vllm"), reason="needs an environment without vllm")
def test_plugins_say_which_libraries_are_missing(capsys):
    import json

    assert cli.main(["plugins", "--json"]) == 0
    plugins = {p["name"]: p for p in json.loads(capsys.readouterr().out)["plugins"]}
    assert plugins["vllm"]["missing"] == {"vllm": ["vllm"]}
    assert plugins["fsdp"]["missing"] == {} and plugins["rlcore.builtins"]["missing"] == {}  # wandb etc. installed
    assert cli.main(["plugins"]) == 0
    assert "    vllm: NOT READY, vllm is not installed (pip install 'rlcore[vllm]')" in capsys.readouterr().out


def test_data_files_without_the_columns_a_job_reads_are_named_before_anything_starts(tmp_path, data):
    """Only the parquet schema is read: a file of the wrong shape is refused by ``config validate``,
    not minutes later in the data loader."""
    folder = tmp_path / "val"
    folder.mkdir()
    write_parquet(folder / "part-0.parquet", question=["1 + 1?"], data_source=["openai/gsm8k"])
    (tmp_path / "notes.parquet").write_text("not parquet")
    message = problems([f"data.train_files=['{data}', '{tmp_path / 'notes.parquet'}']",
                        f"data.val_files=['{folder}']"], tmp_path)
    assert "data.train_files[1]: train data file " in message and "is not a readable parquet file" in message
    assert ("data.val_files[0]: val data file " in message
            and "part-0.parquet has no column 'prompt', 'reward_model' (data.prompt_key = 'prompt'); "
                "its columns: question, data_source" in message)
    assert "data.train_files[0]" not in message  # the good file passes
    with_key = problems([f"data.train_files=['{folder}']", "data.prompt_key=question"], tmp_path)
    assert "has no column 'reward_model' (data.prompt_key = 'question')" in with_key


def test_the_distillation_teacher_folder_is_checked_like_the_models(tmp_path):
    (tmp_path / "teacher").mkdir()
    message = problems(["distillation.enable=true", f"distillation.teacher_path='{tmp_path / 'teacher'}'"], tmp_path)
    assert "distillation.teacher_path = " in message and "the folder has no config.json" in message


def test_a_vision_language_model_on_a_backend_that_does_not_forward_images_is_refused_with_the_files(
        tmp_path, data, capsys):
    """Said by `config validate` beside any other problem (megatron-core missing, in the main environment),
    rather than after megatron-core is installed and the data loaded; fsdp, which forwards images, passes."""
    folder = tmp_path / "vl"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "qwen2_5_vl"}')
    (folder / "preprocessor_config.json").write_text("{}")
    job = [f"data.train_files=['{data}']", f"model.path='{folder}'", f"trainer.default_local_dir='{tmp_path / 'run'}'"]
    assert cli.main(["config", "validate", *job, "trainer.backend='megatron'"]) == 2
    assert (f"trainer.backend = 'megatron' does not forward images (backends that do: fsdp"
            in (err := capsys.readouterr().err))
    assert (f"and model.path = '{folder}' is a vision-language model (it has preprocessor_config.json): train it "
            "with one of those") in err
    assert cli.main(["config", "validate", *job, "trainer.backend='fsdp'"]) == 0
    (folder / "preprocessor_config.json").unlink()  # a text model: megatron's own checks only
    cli.main(["config", "validate", *job, "trainer.backend='megatron'"])
    assert "does not forward images" not in capsys.readouterr().err


def machine_problems_of(overrides, tmp_path) -> str:
    """The problems ``rlcore config validate`` reports for a job of the installed plugins, '' where none."""
    try:
        load_job(None, [f"trainer.default_local_dir='{tmp_path / 'run'}'", *overrides], machine=True)
    except ConfigError as exc:
        return str(exc)
    return ""


@pytest.mark.parametrize("platform, said", [
    ("cpu", "the cpu platform has no way to run two processes' kernels side by side"),
    ("cuda", "nvidia-cuda-mps-control is not on PATH (it comes with the NVIDIA driver's utilities)"),
])
def test_side_by_side_kernels_asked_where_this_machine_cannot_start_them_are_refused_before_the_job(
        data, tmp_path, monkeypatch, platform, said):
    """Found by the trainer at start before, after Ray and the workers' start; now with the other problems."""
    from rlcore.runtime import platforms

    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    kinds = {"cpu": platforms.CpuPlatform, "cuda": platforms.CudaPlatform}
    monkeypatch.setattr(platforms, "_current", kinds[platform]())
    job = [f"data.train_files=['{data}']", 'async_training.mode="colocated"']
    assert (f"async_training.device_sharing = 'concurrent': {said}; set device_sharing = 'auto' (it takes turns "
            "then) or 'time_slicing'") in machine_problems_of([*job, 'async_training.device_sharing="concurrent"'],
                                                               tmp_path)
    for other in ("auto", "time_slicing"):
        assert "device_sharing" not in machine_problems_of([*job, f'async_training.device_sharing="{other}"'], tmp_path)
