//! kube-rs against the embedded server: reflector, Controller, resumed watches, 410 + relist,
//! restarts.

mod common;

use common::eventually;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::json;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

fn node(name: &str) -> Node {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"role": "worker"}}}))
        .expect("node")
}

fn names(store: &reflector::Store<Node>) -> BTreeSet<String> {
    store
        .state()
        .iter()
        .filter_map(|n| n.metadata.name.clone())
        .collect()
}

#[tokio::test]
async fn reflector_follows_another_clients_writes() {
    let sb = common::start().await;
    let reader_client = sb.server.admin_client().await.expect("client");
    let writer = Api::<Node>::all(sb.server.admin_client().await.expect("client"));
    writer
        .create(&PostParams::default(), &node("pre"))
        .await
        .expect("create pre");

    let (store, w) = reflector::store::<Node>();
    let stream = watcher(Api::<Node>::all(reader_client), watcher::Config::default())
        .default_backoff()
        .reflect(w)
        .applied_objects();
    let task = tokio::spawn(stream.for_each(|_| async {}));
    store.wait_until_ready().await.expect("ready");
    assert_eq!(names(&store), BTreeSet::from(["pre".to_string()]));

    for n in ["a", "b", "c"] {
        writer
            .create(&PostParams::default(), &node(n))
            .await
            .expect("create");
    }
    writer
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}})),
        )
        .await
        .expect("patch");
    writer
        .delete("b", &DeleteParams::default())
        .await
        .expect("delete");
    eventually("reflector converges", || {
        let s = store.clone();
        async move {
            let want: BTreeSet<String> = ["pre", "a", "c"].iter().map(|s| s.to_string()).collect();
            let a_labelled = s.state().iter().any(|n| {
                n.metadata.name.as_deref() == Some("a")
                    && n.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get("x"))
                        .is_some()
            });
            (names(&s) == want && a_labelled).then_some(())
        }
    })
    .await;
    task.abort();
}

#[tokio::test]
async fn streaming_list_watcher_gets_initial_events_then_changes() {
    let sb = common::start().await;
    let writer = Api::<Node>::all(sb.server.admin_client().await.expect("client"));
    for n in ["s1", "s2"] {
        writer
            .create(&PostParams::default(), &node(n))
            .await
            .expect("create");
    }
    let (store, w) = reflector::store::<Node>();
    let stream = watcher(
        Api::<Node>::all(sb.server.admin_client().await.expect("client")),
        watcher::Config::default().streaming_lists(),
    )
    .default_backoff()
    .reflect(w)
    .applied_objects();
    let task = tokio::spawn(stream.for_each(|_| async {}));
    store.wait_until_ready().await.expect("ready");
    assert_eq!(names(&store).len(), 2);
    writer
        .create(&PostParams::default(), &node("s3"))
        .await
        .expect("create");
    eventually("s3 seen", || {
        let s = store.clone();
        async move { names(&s).contains("s3").then_some(()) }
    })
    .await;
    task.abort();
}

#[tokio::test]
async fn controller_reconciles_creates_updates_and_deletes() {
    let sb = common::start().await;
    let client = sb.server.admin_client().await.expect("client");
    let api = Api::<Node>::all(client.clone());
    let ctl_api = api.clone();
    let seen = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen2 = seen.clone();
    let ctl = tokio::spawn(async move {
        Controller::new(ctl_api.clone(), watcher::Config::default())
            .run(
                move |n: Arc<Node>, _ctx: Arc<()>| {
                    let api = ctl_api.clone();
                    let seen = seen2.clone();
                    async move {
                        let name = n.metadata.name.clone().unwrap_or_default();
                        let gen_label = n
                            .metadata
                            .labels
                            .as_ref()
                            .and_then(|l| l.get("gen"))
                            .cloned()
                            .unwrap_or_default();
                        seen.lock()
                            .expect("lock")
                            .push(format!("{name}:{gen_label}"));
                        let ann = n
                            .metadata
                            .annotations
                            .as_ref()
                            .and_then(|a| a.get("reconciled"))
                            .cloned();
                        if ann.as_deref() != Some(gen_label.as_str()) {
                            api.patch(
                                &name,
                                &PatchParams::default(),
                                &Patch::Merge(
                                    json!({"metadata": {"annotations": {"reconciled": gen_label}}}),
                                ),
                            )
                            .await?;
                        }
                        Ok::<_, kube::Error>(Action::await_change())
                    }
                },
                |_n, _e, _ctx| Action::requeue(Duration::from_millis(200)),
                Arc::new(()),
            )
            .for_each(|_| async {})
            .await
    });
    for n in ["n1", "n2"] {
        api.create(&PostParams::default(), &node(n))
            .await
            .expect("create");
    }
    api.patch(
        "n1",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"gen": "2"}}})),
    )
    .await
    .expect("patch");
    eventually("controller writes back", || {
        let api = api.clone();
        async move {
            let n1 = api.get("n1").await.ok()?;
            let n2 = api.get("n2").await.ok()?;
            let a1 = n1.metadata.annotations?.get("reconciled").cloned()?;
            let a2 = n2.metadata.annotations?.get("reconciled").cloned()?;
            (a1 == "2" && a2.is_empty()).then_some(())
        }
    })
    .await;
    api.delete("n2", &DeleteParams::default())
        .await
        .expect("delete");
    eventually("n2 gone", || {
        let api = api.clone();
        async move { api.get_opt("n2").await.ok()?.is_none().then_some(()) }
    })
    .await;
    assert!(seen.lock().expect("lock").iter().any(|s| s == "n1:2"));
    ctl.abort();
}

#[tokio::test]
async fn resumed_watch_sees_exactly_the_missed_events() {
    let sb = common::start().await;
    let api = Api::<Node>::all(sb.server.admin_client().await.expect("client"));
    api.create(&PostParams::default(), &node("a"))
        .await
        .expect("a");
    let rv = api
        .list(&ListParams::default())
        .await
        .expect("list")
        .metadata
        .resource_version
        .expect("rv");
    api.create(&PostParams::default(), &node("b"))
        .await
        .expect("b");
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"m": "1"}}})),
    )
    .await
    .expect("patch");
    api.delete("b", &DeleteParams::default())
        .await
        .expect("delete");
    let mut stream = api
        .watch(&WatchParams::default().timeout(5), &rv)
        .await
        .expect("watch")
        .boxed();
    let mut got = Vec::new();
    while let Some(ev) = stream.try_next().await.expect("event") {
        let s = match ev {
            WatchEvent::Added(n) => format!("ADDED {}", n.metadata.name.unwrap_or_default()),
            WatchEvent::Modified(n) => format!("MODIFIED {}", n.metadata.name.unwrap_or_default()),
            WatchEvent::Deleted(n) => format!("DELETED {}", n.metadata.name.unwrap_or_default()),
            WatchEvent::Bookmark(_) => continue,
            WatchEvent::Error(e) => panic!("unexpected error {e:?}"),
        };
        got.push(s);
        if got.len() == 3 {
            break;
        }
    }
    assert_eq!(got, vec!["ADDED b", "MODIFIED a", "DELETED b"]);
}

#[tokio::test]
async fn too_old_resource_version_is_an_in_stream_410() {
    let sb = common::start().await;
    let api = Api::<Node>::all(sb.server.admin_client().await.expect("client"));
    api.create(&PostParams::default(), &node("a"))
        .await
        .expect("a");
    let rv = api
        .list(&ListParams::default())
        .await
        .expect("list")
        .metadata
        .resource_version
        .expect("rv");
    api.create(&PostParams::default(), &node("b"))
        .await
        .expect("b");
    sb.server.compact();
    let mut stream = api
        .watch(&WatchParams::default().timeout(5), &rv)
        .await
        .expect("watch returns 200")
        .boxed();
    match stream.try_next().await.expect("event") {
        Some(WatchEvent::Error(e)) => {
            assert_eq!(e.code, 410);
            assert_eq!(e.reason, "Expired");
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
    // A list with a continue token from before the compaction is expired as well.
    let page = api
        .list(&ListParams::default().limit(1))
        .await
        .expect("page");
    let token = page.metadata.continue_.expect("continue token");
    api.create(&PostParams::default(), &node("c"))
        .await
        .expect("c");
    sb.server.compact();
    let err = api
        .list(&ListParams::default().limit(1).continue_token(&token))
        .await
        .expect_err("expired continue");
    match err {
        kube::Error::Api(s) => assert_eq!(s.code, 410),
        other => panic!("unexpected {other:?}"),
    }
}

/// The watcher survives a restart during which the world changed (history lost, so it relists
/// after a 410) and ends with exactly the server's objects: none lost, none phantom.
#[tokio::test]
async fn watcher_recovers_across_restarts_without_lost_or_phantom_objects() {
    let sb = common::start().await;
    let dir = sb.dir.path().to_path_buf();
    let port = sb.server.addr().port();
    let api = Api::<Node>::all(sb.server.admin_client().await.expect("client"));
    for n in ["keep", "gone"] {
        api.create(&PostParams::default(), &node(n))
            .await
            .expect("create");
    }
    // The watcher's client keeps pointing at the original port across restarts.
    let watch_client = sb.server.admin_client().await.expect("client");
    let (store, w) = reflector::store::<Node>();
    let stream = watcher(Api::<Node>::all(watch_client), watcher::Config::default())
        .default_backoff()
        .reflect(w)
        .touched_objects();
    let task = tokio::spawn(stream.for_each(|_| async {}));
    store.wait_until_ready().await.expect("ready");
    eventually("initial sync", || {
        let s = store.clone();
        async move { (names(&s).len() == 2).then_some(()) }
    })
    .await;

    // 1. Plain restart on the same port: the watcher resumes.
    sb.server.shutdown().await.expect("shutdown");
    let server = apiserver::ApiServer::start(apiserver::ServerConfig {
        addr: format!("127.0.0.1:{port}").parse().expect("addr"),
        ..apiserver::ServerConfig::with_dir(&dir)
    })
    .await
    .expect("restart");
    let api = Api::<Node>::all(server.admin_client().await.expect("client"));
    api.create(&PostParams::default(), &node("after-restart"))
        .await
        .expect("create");
    eventually("watcher resumed", || {
        let s = store.clone();
        async move { names(&s).contains("after-restart").then_some(()) }
    })
    .await;

    // 2. Changes made while the watcher could not see them (another instance on another port),
    //    then the server comes back without that history: the watcher gets a 410 and relists.
    server.shutdown().await.expect("shutdown");
    let other = apiserver::ApiServer::start(apiserver::ServerConfig::with_dir(&dir))
        .await
        .expect("other instance");
    let oapi = Api::<Node>::all(other.admin_client().await.expect("client"));
    oapi.delete("gone", &DeleteParams::default())
        .await
        .expect("delete while away");
    oapi.create(&PostParams::default(), &node("born-while-away"))
        .await
        .expect("create while away");
    oapi.patch(
        "keep",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"v": "2"}}})),
    )
    .await
    .expect("patch");
    other.shutdown().await.expect("shutdown other");
    let server = apiserver::ApiServer::start(apiserver::ServerConfig {
        addr: format!("127.0.0.1:{port}").parse().expect("addr"),
        ..apiserver::ServerConfig::with_dir(&dir)
    })
    .await
    .expect("restart again");
    let api = Api::<Node>::all(server.admin_client().await.expect("client"));
    let truth: BTreeSet<String> = api
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    assert_eq!(
        truth,
        ["after-restart", "born-while-away", "keep"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    );
    eventually("watcher relisted to the truth", || {
        let s = store.clone();
        let truth = truth.clone();
        async move {
            let keep_v2 = s.state().iter().any(|n| {
                n.metadata.name.as_deref() == Some("keep")
                    && n.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get("v"))
                        .map(String::as_str)
                        == Some("2")
            });
            (names(&s) == truth && keep_v2).then_some(())
        }
    })
    .await;
    assert!(
        server.expired_watches() >= 1,
        "the watcher should have been told 410 Expired"
    );
    task.abort();
    server.shutdown().await.expect("shutdown");
}
