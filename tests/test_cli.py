"""The ``onnax`` command line: every subcommand on small models, --check, and error handling."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest

from onnax.cli import main, parse_axes, parse_dims

F64 = ir.DataType.DOUBLE


def _loss_model(dtype: ir.DataType = F64, batch: int | str = 3) -> ir.Model:
    x = ir.val("x", dtype, [batch, 2])
    w = ir.val("w", dtype, [2])
    tape = ir.tape.Tape()
    y = tape.op("Tanh", [tape.op("Mul", [x, w])])
    y.name = "y"
    loss = tape.op("ReduceSum", [tape.op("Mul", [y, y])], {"keepdims": 0})
    loss.name = "loss"
    graph = ir.Graph([x, w], [y, loss], nodes=tape.nodes, opset_imports={"": 18}, name="m")
    return ir.Model(graph, ir_version=10)


@pytest.fixture
def model_path(tmp_path: Path) -> Path:
    path = tmp_path / "m.onnx"
    ir.save(_loss_model(), path)
    return path


@pytest.mark.parametrize(
    ("command", "extra", "added"),
    [
        ("jvp", ["--inputs", "x"], ["fwd_y", "fwd_loss"]),
        ("vjp", ["--outputs", "y"], ["adj_x", "adj_w"]),
        ("grad", ["--output", "loss"], ["grad_x", "grad_w"]),
        ("jacfwd", ["--inputs", "w"], ["jac_y_w", "jac_loss_w"]),
        ("jacrev", ["--outputs", "loss"], ["jac_loss_x", "jac_loss_w"]),
        ("hessian", ["--inputs", "w"], ["hess_loss_w_w"]),
        ("vmap", ["--in-axes", "x=0,w=None", "--axis-size", "4"], []),
    ],
)
def test_transforms_with_check(
    model_path: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    extra: list[str],
    added: list[str],
) -> None:
    out = tmp_path / "out.onnx"
    assert main([command, str(model_path), str(out), "--check", *extra]) == 0
    printed = capsys.readouterr()
    result = ir.load(out)
    names = [v.name for v in result.graph.outputs]
    assert names[:2] == ["y", "loss"] and names[2:] == added
    assert "|err|" in printed.out and "tolerance" in printed.out and "FAIL" not in printed.out
    assert printed.out.count(" ok") >= max(1, len(added))
    assert "onnax [" in printed.err  # progress


def test_vmap_axes_by_position(
    model_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.onnx"
    assert (
        main(
            [
                "vmap",
                str(model_path),
                str(out),
                "--in-axes",
                "1,None",
                "--out-axes=-1",
                "--check",
                "--quiet",
            ]
        )
        == 0
    )
    printed = capsys.readouterr()
    assert printed.err == ""
    assert [str(d) for d in ir.load(out).graph.inputs[0].shape.dims] == ["3", "batch", "2"]
    assert "FAIL" not in printed.out


def test_parse_axes_and_dims() -> None:
    assert parse_axes(None) == 0
    assert parse_axes("None") is None
    assert parse_axes("0,None,-1") == (0, None, -1)
    assert parse_axes("x=0,w=None") == {"x": 0, "w": None}
    assert parse_dims(["N=4", "M=symbolic"]) == {"N": 4, "M": None}


def test_info(model_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(model_path)]) == 0
    out = capsys.readouterr().out
    assert "x                        DOUBLE   [3, 2]" in out
    assert "loss                     DOUBLE   []" in out
    assert "opsets {'': 18}" in out
    assert "Tanh" in out and "lacking jvp rules: none" in out


def test_info_names_missing_rules(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    x = ir.val("x", F64, [3])
    tape = ir.tape.Tape()
    y = tape.op("Foo", [x], domain="custom.domain")
    y.name = "y"
    model = ir.Model(
        ir.Graph([x], [y], nodes=tape.nodes, opset_imports={"": 18, "custom.domain": 1}, name="g"),
        ir_version=10,
    )
    path = tmp_path / "c.onnx"
    ir.save(model, path)
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "lacking jvp rules: custom.domain::Foo" in out
    assert "lacking vmap rules: custom.domain::Foo" in out


def test_family(model_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "gen" / "f.onnx"
    assert (
        main(["family", str(model_path), str(target), "--kinds", "adj,fwd_adj,fwd", "--check"]) == 0
    )
    out = capsys.readouterr().out
    assert sorted(p.name for p in target.parent.iterdir()) == [
        "adj_f.onnx",
        "f.onnx",
        "fwd_adj_f.onnx",
        "fwd_f.onnx",
    ]
    assert "contract check: ok" in out and "differentiable inputs ['x', 'w']" in out


def test_family_onnx_layout_and_dims(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "n.onnx"
    ir.save(_loss_model(batch="N"), source)
    target = tmp_path / "f.onnx"
    assert main(["family", str(source), str(target)]) == 2
    err = capsys.readouterr().err
    assert "symbolic dimensions ['N']" in err and "--dim NAME=4" in err
    assert not target.exists()
    assert main(["family", str(source), str(target), "--dim", "N=5", "--layout", "onnx"]) == 0
    adj = ir.load(tmp_path / "adj_f.onnx").graph
    assert [str(d) for d in adj.inputs[2].shape.dims] == ["5", "2", "nadj"]


def test_errors_exit_2_with_one_paragraph(
    model_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o.onnx"
    assert main(["vjp", str(model_path), str(out), "--inputs", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("onnax vjp: no graph input or initializer named 'nope'")
    assert "Traceback" not in "\n".join(err)
    assert main(["jvp", str(tmp_path / "missing.onnx"), str(out)]) == 2
    assert "no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    assert main(["info", str(bad)]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["vmap", str(model_path), str(out), "--in-axes", "0,x"]) == 2
    assert "an axis must be an integer or None" in capsys.readouterr().err


def test_debug_shows_the_traceback(
    model_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(["--debug", "grad", str(model_path), str(tmp_path / "o.onnx"), "--output", "y"]) == 2
    )
    err = capsys.readouterr().err
    assert "Traceback" in err and "SelectionError" in err
    assert (
        main(["grad", str(model_path), str(tmp_path / "o.onnx"), "--output", "y", "--debug"]) == 2
    )
    assert "Traceback" in capsys.readouterr().err


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["jvp"])
    assert exc.value.code == 2


def test_demo(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == 0
    assert "all derivatives agree" in capsys.readouterr().out


def test_float32_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "m32.onnx"
    ir.save(_loss_model(ir.DataType.FLOAT), source)
    assert main(["hessian", str(source), str(tmp_path / "h.onnx"), "--inputs", "w", "--check"]) == 0
    assert "FAIL" not in capsys.readouterr().out
    np.testing.assert_equal(ir.load(tmp_path / "h.onnx").graph.outputs[2].dtype, ir.DataType.FLOAT)
