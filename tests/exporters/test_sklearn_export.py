"""`ferry export sklearn` on estimators fitted to scikit-learn's bundled breast-cancer data."""

from __future__ import annotations

import re
import subprocess
import sys

import joblib
import numpy as np
import onnxruntime as ort
import pytest

from ferry.cli import main
from tests.support import plain_graphs

pytestmark = pytest.mark.integration


@pytest.fixture(
    scope="module", params=["gradient_boosting", "logistic_regression", "xgboost", "lightgbm"]
)
def estimator_file(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    path = folder / "estimator.joblib"
    joblib.dump(plain_graphs.breast_cancer_estimator(request.param), path)
    return path


@pytest.fixture(scope="module", params=["npy", "csv"])
def sample_file(request, tmp_path_factory):
    rows = plain_graphs.breast_cancer_rows()[:100]
    path = tmp_path_factory.mktemp("sample") / f"rows.{request.param}"
    if request.param == "npy":
        np.save(path, rows)
    else:  # with a header line, as a data frame writes it
        header = ",".join(f"feature_{i}" for i in range(rows.shape[1]))
        np.savetxt(path, rows, delimiter=",", header=header, comments="")
    return path


def test_the_export_matches_predict_proba_and_says_so(
    estimator_file, sample_file, tmp_path, capsys
):
    out = tmp_path / "model.onnx"
    argv = ["export", "sklearn", "--estimator", str(estimator_file), "--sample", str(sample_file)]
    assert main([*argv, "--out", str(out)]) == 0
    said = capsys.readouterr()
    report = said.out
    # Not on a terminal: a line per step on stderr, with its share of the work and the time left.
    steps = said.err.splitlines()
    assert re.fullmatch(
        r"ferry export sklearn: converting with skl2onnx in [\d.]+s \(50%, about [\d.]+s left\)",
        steps[0],
    )
    assert re.fullmatch(
        r"ferry export sklearn: comparing on 100 sample rows in [\d.]+s \(100%\)", steps[1]
    )
    assert len(steps) == 2 and "\r" not in said.err
    assert "parity on 100 rows against predict_proba" in report
    assert "labels equal to predict: 100/100" in report and "  ok" in report
    session = ort.InferenceSession(str(out))
    assert [i.shape for i in session.get_inputs()] == [[None, 30]]  # batchable when served


def test_a_graph_further_than_the_tolerance_fails_the_export(estimator_file, tmp_path, capsys):
    sample = tmp_path / "rows.npy"
    np.save(sample, plain_graphs.breast_cancer_rows()[:50])
    argv = ["export", "sklearn", "--estimator", str(estimator_file), "--sample", str(sample)]
    # float32 in the graph against float64 in scikit-learn: never exactly equal.
    assert main([*argv, "--out", str(tmp_path / "m.onnx"), "--tolerance", "0"]) == 1
    assert "NOT OK" in capsys.readouterr().out


def _iris_with_text() -> tuple[list[str], list[list[object]], np.ndarray]:
    """scikit-learn's iris, two of its measures and a text column made from a third."""
    from sklearn.datasets import load_iris

    x, y = load_iris(return_X_y=True)
    size = np.where(x[:, 2] > 4.0, "long", np.where(x[:, 2] > 2.0, "medium", "short"))
    rows = [[float(a), float(b), str(s)] for a, b, s in zip(x[:, 0], x[:, 1], size, strict=True)]
    return ["sepal_length", "sepal_width", "petal_size"], rows, y


def _mixed_pipeline(columns):
    from sklearn.compose import ColumnTransformer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    numeric, text = columns[:2], columns[2:]
    encode = ColumnTransformer(
        [("numbers", StandardScaler(), numeric), ("text", OneHotEncoder(), text)]
    )
    return make_pipeline(encode, LogisticRegression(max_iter=500))


def _write_csv(path, header, rows):
    lines = [",".join(header)] if header else []
    path.write_text("\n".join(lines + [",".join(map(str, row)) for row in rows]) + "\n")
    return path


@pytest.mark.parametrize("fitted_on", ["data_frame", "object_array"])
def test_a_pipeline_with_text_columns_exports_one_input_per_column(fitted_on, tmp_path, capsys):
    names, rows, y = _iris_with_text()
    if fitted_on == "data_frame":  # columns chosen by name; the CSV's header names them
        import pandas as pd

        model = _mixed_pipeline(names).fit(pd.DataFrame(rows, columns=names), y)
        sample, inputs = _write_csv(tmp_path / "rows.csv", names, rows[::3]), names
    else:  # by position, no header: inputs named column_0, column_1, ...
        model = _mixed_pipeline([0, 1, 2]).fit(np.array(rows, dtype=object), y)
        sample = _write_csv(tmp_path / "rows.csv", None, rows[::3])
        inputs = ["column_0", "column_1", "column_2"]
    joblib.dump(model, tmp_path / "model.joblib")
    out = tmp_path / "model.onnx"
    argv = ["export", "sklearn", "--estimator", str(tmp_path / "model.joblib")]
    assert main([*argv, "--sample", str(sample), "--out", str(out)]) == 0
    report = capsys.readouterr().out
    assert "parity on 50 rows against predict_proba" in report and "  ok" in report
    session = ort.InferenceSession(str(out))
    assert [(i.name, i.type, i.shape) for i in session.get_inputs()] == [
        (inputs[0], "tensor(float)", [None, 1]),
        (inputs[1], "tensor(float)", [None, 1]),
        (inputs[2], "tensor(string)", [None, 1]),
    ]


def test_a_lightgbm_ranker_exports_its_scores(tmp_path, capsys):
    from lightgbm import LGBMRanker

    x, relevance = plain_graphs.breast_cancer_rows(), plain_graphs.breast_cancer_labels()
    ranker = LGBMRanker(n_estimators=20, n_jobs=1, verbose=-1)
    ranker.fit(x, relevance, group=[100] * 5 + [69])
    joblib.dump(ranker, tmp_path / "ranker.joblib")
    np.save(tmp_path / "rows.npy", x[:100])
    argv = ["export", "sklearn", "--estimator", str(tmp_path / "ranker.joblib")]
    argv += ["--sample", str(tmp_path / "rows.npy"), "--out", str(tmp_path / "m.onnx")]
    assert main(argv) == 0
    report = capsys.readouterr().out
    assert "parity on 100 rows against predict:" in report and "  ok" in report


@pytest.mark.parametrize("in_pipeline", [False, True])
def test_an_estimator_skl2onnx_cannot_convert_is_named_in_one_line(in_pipeline, tmp_path):
    """Exit 2 and one line naming it (in a pipeline too): no traceback, no paragraph."""
    joblib.dump(_unconvertible(in_pipeline), tmp_path / "model.joblib")
    np.save(tmp_path / "rows.npy", plain_graphs.breast_cancer_rows()[:20])
    argv = ["-m", "ferry", "export", "sklearn", "--estimator", str(tmp_path / "model.joblib")]
    argv += ["--sample", str(tmp_path / "rows.npy"), "--out", str(tmp_path / "m.onnx")]
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: cannot convert LabelSpreading "
        "(sklearn.semi_supervised._label_propagation.LabelSpreading) to ONNX: "
        "skl2onnx has no converter for it"
    ]
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "m.onnx").exists()


def _unconvertible(in_pipeline: bool):
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.semi_supervised import LabelSpreading

    model = make_pipeline(StandardScaler(), LabelSpreading()) if in_pipeline else LabelSpreading()
    return model.fit(
        plain_graphs.breast_cancer_rows()[:100], plain_graphs.breast_cancer_labels()[:100]
    )
