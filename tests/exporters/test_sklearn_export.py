"""`ferry export sklearn` on estimators fitted to scikit-learn's bundled breast-cancer data."""

from __future__ import annotations

import joblib
import numpy as np
import onnxruntime as ort
import pytest

from ferry.cli import main
from tests.support import plain_graphs


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
    report = capsys.readouterr().out
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
