//! The real kubectl binary against the embedded server.

mod common;

use common::kubectl;
use std::time::Duration;
use tokio::io::AsyncBufReadExt;

const CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: trustzones.k8s.ovn.org
spec:
  group: k8s.ovn.org
  scope: Cluster
  names: {plural: trustzones, singular: trustzone, kind: TrustZone, shortNames: [tz]}
  versions:
  - name: v1alpha1
    served: true
    storage: true
    subresources: {status: {}}
    additionalPrinterColumns:
    - {name: Zone, type: string, jsonPath: .spec.zone}
    - {name: Weight, type: integer, jsonPath: .spec.weight}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [zone]
            properties:
              zone: {type: string, pattern: '^[a-z0-9-]+$'}
              weight: {type: integer, minimum: 0, maximum: 100}
          status:
            type: object
            x-kubernetes-preserve-unknown-fields: true
"#;

const TZ: &str = r#"
apiVersion: k8s.ovn.org/v1alpha1
kind: TrustZone
metadata:
  name: tz1
spec:
  zone: blue
  weight: 5
  notInSchema: dropped
"#;

const NODE: &str = r#"
apiVersion: v1
kind: Node
metadata:
  name: node-a
  labels:
    kubernetes.io/hostname: node-a
spec:
  podCIDR: 10.244.1.0/24
"#;

fn ok(o: &common::Out, what: &str) {
    assert!(
        o.ok,
        "{what} failed:\nstdout: {}\nstderr: {}",
        o.stdout, o.stderr
    );
}

#[tokio::test]
async fn kubectl_end_to_end() {
    let sb = common::start().await;
    let kc = sb.dir.path().join("kubeconfig");

    let o = kubectl(&kc, &["version", "-o", "json"], None).await;
    ok(&o, "version");
    assert!(o.stdout.contains("v1.33"), "{}", o.stdout);

    ok(
        &kubectl(&kc, &["apply", "-f", "-"], Some(CRD)).await,
        "apply CRD",
    );
    ok(
        &kubectl(
            &kc,
            &[
                "wait",
                "--for",
                "condition=established",
                "crd/trustzones.k8s.ovn.org",
                "--timeout=60s",
            ],
            None,
        )
        .await,
        "wait CRD",
    );
    let o = kubectl(&kc, &["apply", "-f", "-"], Some(TZ)).await;
    ok(&o, "apply TrustZone");
    assert!(
        o.stdout.contains("trustzone.k8s.ovn.org/tz1 created"),
        "{}",
        o.stdout
    );

    let o = kubectl(&kc, &["get", "trustzones"], None).await;
    ok(&o, "get trustzones");
    let header = o.stdout.lines().next().unwrap_or_default().to_string();
    assert!(
        header.contains("NAME") && header.contains("ZONE") && header.contains("WEIGHT"),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout
            .lines()
            .any(|l| l.contains("tz1") && l.contains("blue") && l.contains('5')),
        "{}",
        o.stdout
    );

    let o = kubectl(&kc, &["get", "tz", "tz1", "-o", "json"], None).await;
    ok(&o, "get -o json");
    let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("json");
    assert!(
        v["spec"].get("notInSchema").is_none(),
        "unknown field pruned: {v}"
    );

    ok(
        &kubectl(&kc, &["label", "trustzone", "tz1", "team=a"], None).await,
        "label CR",
    );
    ok(
        &kubectl(&kc, &["annotate", "trustzone", "tz1", "note=hi"], None).await,
        "annotate CR",
    );
    ok(
        &kubectl(
            &kc,
            &[
                "patch",
                "trustzone",
                "tz1",
                "--type",
                "merge",
                "-p",
                r#"{"spec":{"weight":7}}"#,
            ],
            None,
        )
        .await,
        "patch CR",
    );
    let o = kubectl(&kc, &["get", "tz", "tz1", "-o", "json"], None).await;
    let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("json");
    assert_eq!(v["metadata"]["labels"]["team"], "a");
    assert_eq!(v["metadata"]["annotations"]["note"], "hi");
    assert_eq!(v["spec"]["weight"], 7);
    assert_eq!(v["metadata"]["generation"], 2);

    let o = kubectl(
        &kc,
        &[
            "patch",
            "trustzone",
            "tz1",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"weight":700}}"#,
        ],
        None,
    )
    .await;
    assert!(!o.ok);
    assert!(
        o.stderr.contains("is invalid") && o.stderr.contains("spec.weight"),
        "{}",
        o.stderr
    );

    // Built-in objects.
    let ns = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: t1\n";
    let o = kubectl(&kc, &["create", "-f", "-"], Some(ns)).await;
    ok(&o, "create ns");
    let o = kubectl(&kc, &["create", "-f", "-"], Some(ns)).await;
    assert!(!o.ok);
    assert!(o.stderr.contains("Error from server (AlreadyExists): error when creating \"STDIN\": namespaces \"t1\" already exists"), "{}", o.stderr);
    ok(
        &kubectl(&kc, &["apply", "-f", "-"], Some(NODE)).await,
        "apply node",
    );
    ok(
        &kubectl(
            &kc,
            &["apply", "-f", "-"],
            Some(&NODE.replace(
                "    kubernetes.io/hostname: node-a\n",
                "    kubernetes.io/hostname: node-a\n    extra: \"1\"\n",
            )),
        )
        .await,
        "re-apply node",
    );
    ok(
        &kubectl(&kc, &["label", "node", "node-a", "x=y"], None).await,
        "label node",
    );
    ok(
        &kubectl(&kc, &["annotate", "node", "node-a", "a=b"], None).await,
        "annotate node",
    );
    ok(
        &kubectl(
            &kc,
            &[
                "patch",
                "node",
                "node-a",
                "-p",
                r#"{"metadata":{"labels":{"z":"1"}}}"#,
            ],
            None,
        )
        .await,
        "strategic patch node",
    );
    let o = kubectl(
        &kc,
        &["get", "node", "node-a", "-o", "jsonpath={.metadata.labels}"],
        None,
    )
    .await;
    ok(&o, "get labels");
    for want in [
        "\"x\":\"y\"",
        "\"z\":\"1\"",
        "\"extra\":\"1\"",
        "kubernetes.io/hostname",
    ] {
        assert!(o.stdout.contains(want), "{want} missing in {}", o.stdout);
    }
    let o = kubectl(&kc, &["get", "nodes"], None).await;
    ok(&o, "get nodes");
    assert!(o.stdout.contains("node-a"), "{}", o.stdout);
    ok(
        &kubectl(
            &kc,
            &["create", "-n", "t1", "-f", "-"],
            Some("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm1\ndata:\n  a: b\n"),
        )
        .await,
        "create cm",
    );
    let o = kubectl(&kc, &["get", "cm", "-n", "t1", "-o", "name"], None).await;
    assert!(o.stdout.contains("configmap/cm1"), "{}", o.stdout);

    // kubectl's typed clients send protobuf bodies.
    ok(
        &kubectl(&kc, &["create", "namespace", "t2"], None).await,
        "create namespace (protobuf)",
    );
    ok(
        &kubectl(
            &kc,
            &[
                "create",
                "configmap",
                "cm2",
                "-n",
                "t2",
                "--from-literal=k=v",
            ],
            None,
        )
        .await,
        "create configmap (protobuf)",
    );
    let o = kubectl(
        &kc,
        &["get", "cm", "cm2", "-n", "t2", "-o", "jsonpath={.data.k}"],
        None,
    )
    .await;
    assert_eq!(o.stdout, "v");
    let o = kubectl(&kc, &["create", "namespace", "t2"], None).await;
    assert!(
        o.stderr
            .contains("Error from server (AlreadyExists): namespaces \"t2\" already exists"),
        "{}",
        o.stderr
    );
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::default();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "someone");
    let csr_pem = params
        .serialize_request(&key)
        .expect("csr")
        .pem()
        .expect("pem");
    let csr = format!(
        "apiVersion: certificates.k8s.io/v1\nkind: CertificateSigningRequest\nmetadata:\n  name: csr1\nspec:\n  request: {}\n  signerName: kubernetes.io/kube-apiserver-client\n  usages: [client auth]\n  expirationSeconds: 86400\n",
        base64::Engine::encode(&base64::engine::general_purpose::STANDARD, csr_pem)
    );
    ok(
        &kubectl(&kc, &["create", "-f", "-"], Some(&csr)).await,
        "create csr",
    );
    ok(
        &kubectl(&kc, &["certificate", "approve", "csr1"], None).await,
        "certificate approve (protobuf)",
    );
    let o = kubectl(
        &kc,
        &["get", "csr", "csr1", "-o", "jsonpath={.status.certificate}"],
        None,
    )
    .await;
    assert!(!o.stdout.is_empty(), "certificate issued: {}", o.stderr);

    // kubectl get -w sees a change.
    let mut child = tokio::process::Command::new(common::kubectl_path())
        .args([
            "get",
            "node",
            "node-a",
            "-w",
            "-o",
            "jsonpath={.metadata.labels.w}{\"\\n\"}",
        ])
        .env("KUBECONFIG", &kc)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn watch");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("first line")
        .expect("read");
    assert_eq!(first.as_deref(), Some(""));
    ok(
        &kubectl(&kc, &["label", "node", "node-a", "w=seen"], None).await,
        "label for watch",
    );
    let seen = tokio::time::timeout(Duration::from_secs(60), async {
        while let Ok(Some(l)) = lines.next_line().await {
            if l == "seen" {
                return true;
            }
        }
        false
    })
    .await
    .expect("watch output");
    assert!(seen);
    let _ = child.kill().await;

    // Errors as kubectl prints them for a real server.
    let o = kubectl(&kc, &["get", "node", "nosuch"], None).await;
    assert!(!o.ok);
    assert!(
        o.stderr
            .contains("Error from server (NotFound): nodes \"nosuch\" not found"),
        "{}",
        o.stderr
    );
    let bob = sb.dir.path().join("bob.kubeconfig");
    std::fs::write(
        &bob,
        sb.server.kubeconfig_yaml("bob", &[]).expect("kubeconfig"),
    )
    .expect("write");
    let o = kubectl(&bob, &["get", "nodes"], None).await;
    assert!(!o.ok);
    assert!(
        o.stderr.contains("Error from server (Forbidden): nodes is forbidden: User \"bob\" cannot list resource \"nodes\" in API group \"\" at the cluster scope"),
        "{}",
        o.stderr
    );

    let o = kubectl(&kc, &["delete", "trustzone", "tz1"], None).await;
    ok(&o, "delete CR");
    assert!(
        o.stdout.contains("trustzone.k8s.ovn.org \"tz1\" deleted"),
        "{}",
        o.stdout
    );
    ok(
        &kubectl(&kc, &["delete", "node", "node-a"], None).await,
        "delete node",
    );
    let o = kubectl(&kc, &["get", "tz", "-o", "name"], None).await;
    ok(&o, "get after delete");
    assert!(o.stdout.trim().is_empty(), "{}", o.stdout);
}
