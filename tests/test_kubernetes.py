"""deploy/kubernetes and deploy/docker: every manifest parses, every Dask custom resource
validates against the CRDs that the installed dask-kubernetes ships, the core objects hold what the set-ups
need, the commands in the manifests are buffet command lines, the Dockerfile installs buffet with the line
deploy/README.md gives; and `--cluster kube` parses and fails in one line where it cannot run. No Kubernetes
cluster is reachable here, so a cluster is never started."""

from __future__ import annotations

import functools
import re
import sys
from importlib.metadata import metadata
from importlib.resources import files
from pathlib import Path

import dask
import jsonschema
import pytest
import yaml

from buffet.pipeline.cli import build_parser, main, parse_args
from buffet.pipeline.engine.cluster import kube_cluster_spec
from buffet.pipeline.registry import spec_for

from helpers import unused_port

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
MANIFESTS = sorted((DEPLOY / "kubernetes").glob("*.yaml"))
CRD_FOLDER = "operator/deployment/helm/dask-kubernetes-operator/crds"
IMAGE_TAG = "your-registry/buffet:0.1.0"


def documents() -> list[dict]:
    """Every object of every manifest."""
    return [doc for path in MANIFESTS for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def objects(kind: str) -> list[dict]:
    return [doc for doc in documents() if doc["kind"] == kind]


def strict(schema: object) -> object:
    """``schema`` refusing fields it does not name, as Kubernetes' strict field validation does (a CRD's schema
    alone lets a misspelt field through, and the API server would drop it)."""
    if isinstance(schema, dict):
        schema = {key: strict(value) for key, value in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema and \
                not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    return schema


@functools.cache
def crd_schemas() -> dict[str, dict]:
    """The v1 openAPIV3Schema of each Dask custom resource kind, from the CRD files in dask-kubernetes, with the
    fields every Kubernetes object has (which a CRD's schema leaves out), made strict."""
    schemas = {}
    for path in files("dask_kubernetes").joinpath(CRD_FOLDER).iterdir():
        crd = yaml.load(path.read_text(), Loader=yaml.CSafeLoader)
        version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
        schema = version["schema"]["openAPIV3Schema"]
        schema["properties"] |= {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                                 "metadata": {"type": "object"}}
        schemas[crd["spec"]["names"]["kind"]] = strict(schema)
    return schemas


@functools.cache
def validator(kind: str) -> jsonschema.protocols.Validator:
    """A validator of ``kind``'s CRD schema, its schema checked once."""
    schema = crd_schemas()[kind]
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def validate(resource: dict) -> None:
    """Validate a Dask custom resource against its kind's CRD schema."""
    validator(resource["kind"]).validate(resource)


def containers(pod_spec: dict) -> dict[str, dict]:
    return {c["name"]: c for c in pod_spec["containers"]}


def daskjob(name: str) -> dict:
    return next(job for job in objects("DaskJob") if job["metadata"]["name"] == name)


def option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_every_manifest_parses_into_named_objects():
    assert {p.name for p in MANIFESTS} >= {"daskjob-pvc.yaml", "daskjob-s3.yaml", "storage-pvc.yaml",
                                           "s3-secret.yaml", "network-policy.yaml"}
    for doc in documents():
        assert doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"]


def test_dask_resources_validate_against_the_operator_crds():
    dask_objects = [doc for doc in documents() if doc["apiVersion"].startswith("kubernetes.dask.org/")]
    assert {doc["kind"] for doc in dask_objects} == {"DaskJob"}
    for doc in dask_objects:
        assert doc["apiVersion"] == "kubernetes.dask.org/v1"
        validate(doc)


def test_strict_validation_refuses_a_misspelt_field():
    job = daskjob("buffet-nyt")
    scheduler = job["spec"]["cluster"]["spec"]["scheduler"]["spec"]["containers"][0]
    scheduler["readinesProbe"] = scheduler.pop("readinessProbe")
    with pytest.raises(jsonschema.ValidationError, match="readinesProbe"):
        validate(job)


@pytest.mark.parametrize("kind", ["threads", "processes"])
def test_the_cluster_spec_of_cluster_kube_validates(kind):
    threads = 4 if kind == "threads" else 1
    spec = kube_cluster_spec("buffet-test", IMAGE_TAG, 3, threads)
    validate(spec)
    worker = spec["spec"]["worker"]["spec"]["containers"][0]
    assert option(worker["args"], "--nthreads") == worker["resources"]["limits"]["cpu"] == str(threads)
    assert spec["spec"]["scheduler"]["service"]["selector"]["dask.org/cluster-name"] == "buffet-test"


@pytest.mark.parametrize("name", ["buffet-nyt", "buffet-domino"])
def test_daskjob_runs_a_buffet_fit_on_a_cluster_shaped_for_its_model(name):
    job = daskjob(name)
    runner = containers(job["spec"]["job"]["spec"])["job"]
    assert runner["args"][0] == "buffet"
    args = build_parser().parse_args(runner["args"][1:])  # a valid command line of this buffet
    assert args.command == "fit" and args.scheduler is None  # the operator's DASK_SCHEDULER_ADDRESS names it
    assert job["spec"]["job"]["spec"]["restartPolicy"] == "Never"
    cluster = job["spec"]["cluster"]["spec"]
    worker = containers(cluster["worker"]["spec"])["worker"]
    threads = int(option(worker["args"], "--nthreads"))
    assert worker["args"][:2] == ["dask", "worker"]
    assert threads == int(worker["resources"]["limits"]["cpu"])
    assert (threads > 1) == (spec_for(args.model).worker_kind == "threads")
    scheduler = containers(cluster["scheduler"]["spec"])["scheduler"]
    for container in (worker, scheduler):
        assert container["image"] == runner["image"] == IMAGE_TAG
        probe_port = container["readinessProbe"]["httpGet"]["port"]
        assert container["readinessProbe"]["httpGet"]["path"] == "/health"
        assert probe_port in {p["name"] for p in container["ports"]}


@pytest.mark.parametrize("name", ["buffet-nyt", "buffet-domino"])
def test_scheduler_service_is_cluster_internal_and_selects_the_jobs_scheduler(name):
    service = daskjob(name)["spec"]["cluster"]["spec"]["scheduler"]["service"]
    assert service["type"] == "ClusterIP"
    # the operator names a DaskJob's cluster after the job, and labels its scheduler pod so
    assert service["selector"] == {"dask.org/cluster-name": name, "dask.org/component": "scheduler"}
    assert {p["name"]: p["port"] for p in service["ports"]} == {"tcp-comm": 8786, "http-dashboard": 8787}


def test_network_policy_admits_only_this_namespace_and_the_operator():
    (policy,) = objects("NetworkPolicy")
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchExpressions": [{"key": "dask.org/cluster-name", "operator": "Exists"}]}
    assert spec["policyTypes"] == ["Ingress"]
    sources = [source for rule in spec["ingress"] for source in rule["from"]]
    assert sources == [{"podSelector": {}},
                       {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "dask-operator"}}}]


def test_pvc_setup_ingests_the_store_the_fit_reads():
    (claim,) = objects("PersistentVolumeClaim")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["spec"]["resources"]["requests"]["storage"]
    (ingest_job,) = objects("Job")
    pod = ingest_job["spec"]["template"]["spec"]
    ingest = containers(pod)["ingest"]
    ingest_args = build_parser().parse_args(ingest["args"][1:])
    fit_args = build_parser().parse_args(containers(daskjob("buffet-nyt")["spec"]["job"]["spec"])["job"]["args"][1:])
    assert ingest_args.command == "ingest" and ingest_args.out == fit_args.store
    downloaded = [a for a in containers({"containers": pod["initContainers"]})["download"]["args"] if a.startswith("/data/")]
    assert downloaded == ingest_args.sources
    fit = daskjob("buffet-nyt")["spec"]
    for pod_spec in (pod, fit["job"]["spec"], fit["cluster"]["spec"]["worker"]["spec"]):
        assert pod_spec["volumes"] == [{"name": "buffet-data", "persistentVolumeClaim": {"claimName": "buffet-data"}}]
        for container in pod_spec["containers"]:
            assert {"name": "buffet-data", "mountPath": "/data"} in container["volumeMounts"]


def test_s3_setup_reads_urls_with_credentials_from_the_secret():
    (secret,) = objects("Secret")
    keys = set(secret["stringData"])
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= keys
    job = daskjob("buffet-domino")
    runner = containers(job["spec"]["job"]["spec"])["job"]
    args = build_parser().parse_args(runner["args"][1:])
    assert args.store.startswith("s3://") and args.out.startswith("s3://")
    worker = containers(job["spec"]["cluster"]["spec"]["worker"]["spec"])["worker"]
    scheduler = containers(job["spec"]["cluster"]["spec"]["scheduler"]["spec"])["scheduler"]
    for container in (runner, worker):
        refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"] if "valueFrom" in e}
        assert set(refs) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL"}
        for variable, ref in refs.items():
            assert ref["name"] == secret["metadata"]["name"] and ref["key"] == variable
            assert ref["key"] in keys or ref.get("optional")
    assert "env" not in scheduler  # the scheduler never reads the data


def dockerfile_install_line() -> str:
    (line,) = [ln for ln in (DEPLOY / "docker" / "Dockerfile").read_text().splitlines() if ln.startswith("RUN pip")]
    return line.removeprefix("RUN ")


def test_dockerfile_installs_buffet_with_the_readme_line_and_tags_the_manifests_image():
    readme = (DEPLOY / "README.md").read_text().split("## Kubernetes")[1].split("\n## ")[0]
    assert re.findall(r"^ {4,}(pip install .*)$", readme, re.M) == [dockerfile_install_line()]
    extras = re.search(r'"\.\[(.*)\]"', dockerfile_install_line()).group(1).split(",")
    assert "deploy" in extras and set(extras) <= set(metadata("buffet").get_all("Provides-Extra"))
    assert f"-t {IMAGE_TAG} " in (DEPLOY / "docker" / "Dockerfile").read_text()


@pytest.mark.parametrize("command", [["fit", "bnmf", "s.zarr", "--out", "r"], ["resume", "r"], ["evaluate", "r"]])
def test_cluster_option_parses(command):
    args, _ = parse_args([*command, "--cluster", "kube"])
    assert args.cluster == "kube"
    assert parse_args(command)[0].cluster == "local"
    with pytest.raises(SystemExit):
        parse_args([*command, "--cluster", "yarn"])


def kube_fit_error(capsys, store, run) -> str:
    """The stderr of ``buffet fit bnmf STORE --out RUN --cluster kube``, which must fail without leaving a run."""
    status = main(["fit", "bnmf", store, "--out", str(run), "--k", "3", "--cluster", "kube"])
    err = capsys.readouterr().err
    assert status == 1 and not run.exists()
    assert len(err.strip().splitlines()) == 1, err
    return err


@pytest.fixture
def buffet_image():
    with dask.config.set({"kubernetes.image": IMAGE_TAG}):
        yield


def test_cluster_kube_without_dask_kubernetes(capsys, monkeypatch, corpus_store, tmp_path, buffet_image):
    monkeypatch.setitem(sys.modules, "dask_kubernetes", None)  # as if not installed
    assert 'pip install "buffet[deploy]"' in kube_fit_error(capsys, corpus_store, tmp_path / "run")


def test_cluster_kube_without_an_image_setting(capsys, corpus_store, tmp_path):
    with dask.config.set({"kubernetes.image": "ghcr.io/dask/dask:latest"}):  # dask-kubernetes' default
        assert "DASK_KUBERNETES__IMAGE" in kube_fit_error(capsys, corpus_store, tmp_path / "run")


def test_cluster_kube_without_a_kube_config(capsys, monkeypatch, corpus_store, tmp_path, buffet_image):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    monkeypatch.setenv("HOME", str(tmp_path))
    assert "no Kubernetes configuration" in kube_fit_error(capsys, corpus_store, tmp_path / "run")


def test_cluster_kube_with_an_unreachable_api_server(capsys, monkeypatch, corpus_store, tmp_path, buffet_image):
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "here",
              "clusters": [{"name": "here", "cluster": {"server": f"https://127.0.0.1:{unused_port()}"}}],
              "users": [{"name": "me", "user": {"token": "t"}}],
              "contexts": [{"name": "here", "context": {"cluster": "here", "user": "me"}}]}
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(config))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    assert "cannot reach the Kubernetes API server" in kube_fit_error(capsys, corpus_store, tmp_path / "run")


def test_cluster_kube_and_scheduler_together(capsys, corpus_store, tmp_path):
    status = main(["fit", "bnmf", corpus_store, "--out", str(tmp_path / "run"), "--cluster", "kube",
                   "--scheduler", "tcp://127.0.0.1:1"])
    assert status == 1 and "give only one of them" in capsys.readouterr().err
