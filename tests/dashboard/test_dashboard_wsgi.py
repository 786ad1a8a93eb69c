"""The dashboard as a WSGI app, through Flask's test client: headers, methods, escaping, errors."""

from __future__ import annotations

from collections.abc import Iterator

import flask
import pytest
from flask.testing import FlaskClient
from markupsafe import Markup

from pybatch import ConnectionConfig, JobRepository
from pybatch._cli.dashboard import is_loopback
from pybatch._dashboard import CONTENT_SECURITY_POLICY, create_app
from pybatch._explorer import JobExplorer
from tests.dashboard.conftest import (
    HOSTILE_MESSAGE,
    HOSTILE_NAME,
    HOSTILE_PARAMETER,
    HOSTILE_VALUE,
    SECRET,
    Seeded,
)


@pytest.fixture
def app(pg_config: ConnectionConfig) -> Iterator[flask.Flask]:
    with JobRepository.connect(pg_config) as repository:
        yield create_app(JobExplorer(repository))


@pytest.fixture
def client(app: flask.Flask) -> FlaskClient:
    return app.test_client()


def _pages(seeded: Seeded) -> list[str]:
    return [
        "/",
        "/job?name=nightly_orders",
        "/instances/1",
        f"/executions/{seeded.nightly[1]}",
        f"/executions/{seeded.orphan}",
        "/unresolved",
        "/audit",
        "/static/dashboard.css",
    ]


def test_every_page_carries_the_restrictive_headers(seeded: Seeded, client: FlaskClient) -> None:
    for path in _pages(seeded):
        response = client.get(path)
        assert response.status_code == 200, path
        assert response.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
        assert "default-src 'none'" in CONTENT_SECURITY_POLICY
        assert "frame-ancestors 'none'" in CONTENT_SECURITY_POLICY
        assert "script-src" not in CONTENT_SECURITY_POLICY
        assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert client.get("/nowhere").headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE", "OPTIONS"])
def test_methods_other_than_get_are_405(seeded: Seeded, client: FlaskClient, method: str) -> None:
    for path in ["/", f"/executions/{seeded.nightly[0]}", "/audit", "/static/dashboard.css"]:
        response = client.open(path, method=method)
        assert response.status_code == 405, (method, path)
        assert response.headers["Allow"] == "GET, HEAD"
        assert response.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY


def test_html_in_names_and_messages_is_escaped(seeded: Seeded, client: FlaskClient) -> None:
    jobs = client.get("/").get_data(as_text=True)
    assert "<script>" not in jobs
    assert "&lt;script&gt;document.title=&#39;pwned-name&#39;&lt;/script&gt;" in jobs
    instances = client.get("/job", query_string={"name": HOSTILE_NAME}).get_data(as_text=True)
    assert "<script>" not in instances
    assert "&lt;script&gt;document.title=&#39;pwned-parameter&#39;" in instances
    execution = client.get(f"/executions/{seeded.hostile}").get_data(as_text=True)
    assert "<script>" not in execution
    assert (
        "&lt;script&gt;document.title=&#39;pwned-message&#39;&lt;/script&gt; bad row" in execution
    )
    # An identifying value is shown as text; a non-identifying one is never stored.
    for page in (jobs, instances, execution):
        assert "<img" not in page and HOSTILE_VALUE not in page and SECRET not in page
    assert "&lt;script&gt;document.title=&#39;pwned-value&#39;&lt;/script&gt;&lt;img" in instances
    assert HOSTILE_NAME in Markup(jobs).unescape()
    assert HOSTILE_PARAMETER in Markup(instances).unescape()
    assert (
        HOSTILE_VALUE in Markup(instances).unescape()
        and HOSTILE_VALUE in Markup(execution).unescape()
    )
    assert HOSTILE_MESSAGE in Markup(execution).unescape()


def test_missing_rows_are_404_and_bad_arguments_400(seeded: Seeded, client: FlaskClient) -> None:
    assert client.get("/executions/999999").status_code == 404
    assert client.get("/instances/999999").status_code == 404
    assert client.get("/steps/999999/partitions").status_code == 404
    assert client.get("/?after=zz").status_code == 400
    assert client.get("/?refresh=1").status_code == 400
    assert client.get("/unresolved?older_than=59").status_code == 400


def test_refresh_adds_a_meta_refresh_only_when_asked(seeded: Seeded, client: FlaskClient) -> None:
    assert 'http-equiv="refresh"' not in client.get("/").get_data(as_text=True)
    page = client.get("/?refresh=30").get_data(as_text=True)
    assert '<meta http-equiv="refresh" content="30">' in page


def test_the_filters_keep_the_rows_whose_instance_has_every_value(
    seeded: Seeded, client: FlaskClient
) -> None:
    def instances(*params: str) -> str:
        query = [("name", "nightly_orders"), *(("param", p) for p in params)]
        response = client.get("/job", query_string=query)
        assert response.status_code == 200
        return response.get_data(as_text=True)

    assert instances("business_date=2026-12-01").count('class="instance"') == 3
    second = instances("business_date=2026-12-01", "run.id=2")
    assert second.count('class="instance"') == 1
    assert '<span class="parameter-value" data-kind="i64">2</span>' in second
    assert 'class="instance"' not in instances("region=eu")
    assert client.get("/job?name=nightly_orders&param=nokey").status_code == 400
    assert client.get("/unresolved?param==x").status_code == 400
    stuck = client.get("/unresolved?param=day=2").get_data(as_text=True)
    assert f'data-execution="{seeded.stuck}"' in stuck
    assert client.get("/unresolved?param=day=1").get_data(as_text=True).count("data-execution") == 0


def test_an_execution_names_its_owner_and_parameters(seeded: Seeded, client: FlaskClient) -> None:
    page = client.get(f"/executions/{seeded.nightly[0]}").get_data(as_text=True)
    assert '<span class="parameter-name">business_date</span>=' in page
    assert "ParameterValue" not in page and "redacted" not in page
    owner = page.split('id="execution-owner">')[1].split("<")[0]
    assert owner.rsplit(":", 1)[1].isdigit()  # host:pid of the process that ran it


def test_only_loopback_hosts_are_local() -> None:
    assert all(is_loopback(h) for h in ["127.0.0.1", "127.9.9.9", "::1", "[::1]", "localhost"])
    assert not any(is_loopback(h) for h in ["0.0.0.0", "::", "10.0.0.1", "example.org"])


def test_a_remote_host_without_allow_remote_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pybatch._cli import main

    assert main(["dashboard", "--host", "0.0.0.0", "--port", "8150"]) == 2
    error = capsys.readouterr().err
    assert "CommandArgumentInvalid" in error and "--allow-remote" in error
    assert main(["dashboard", "--port", "0"]) == 2


def test_the_run_history_is_bounded_and_newest_first(
    seeded: Seeded, pg_config: ConnectionConfig
) -> None:
    from pybatch.errors import PageSizeOutOfRange

    with JobRepository.connect(pg_config) as repository:
        explorer = JobExplorer(repository)
        with explorer.pinned() as view:
            history = view.recent_executions("nightly_orders", 2)
        assert [run.execution_id for run in history] == [seeded.nightly[2], seeded.nightly[1]]
        for limit in (0, 51):
            with pytest.raises(PageSizeOutOfRange):
                explorer.recent_executions("nightly_orders", limit)
        assert explorer.recent_executions("no such job") == ()
