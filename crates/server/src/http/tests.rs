use super::*;

#[test]
fn accept_encoding_is_read_as_clients_write_it() {
    let accepts = |values: &[&str]| {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(header::ACCEPT_ENCODING, HeaderValue::from_str(v).unwrap());
        }
        accepts_gzip(&h)
    };
    assert!(accepts(&["gzip"]));
    assert!(accepts(&["gzip, deflate, br"]), "Grafana's");
    assert!(accepts(&["deflate", "GZip;q=0.5"]), "several headers, any case, a weight");
    assert!(accepts(&["*"]));
    assert!(accepts(&["x-gzip"]));
    assert!(!accepts(&[]));
    assert!(!accepts(&["identity"]));
    assert!(!accepts(&["br, deflate"]));
    assert!(!accepts(&["gzip;q=0"]), "refused by weight");
    assert!(!accepts(&["gzip ; q=0.0, identity"]));
    assert!(!accepts(&["gzipped"]));
}

async fn panics() -> &'static str {
    panic!("deliberate")
}

/// A handler that panics, on the async task or on a blocking thread, fails its own request
/// with a 500 in Prometheus' error shape and is counted; the next request is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_fails_its_request_not_the_server() {
    let st = AppState::new(Limits::default(), ApiSwitches::default(), BTreeMap::new(), String::new());
    let app = Router::new()
        .route("/panic", get(panics))
        .route(
            "/panic_blocking",
            get(|| async {
                let n: u32 = blocking(|| -> u32 { panic!("deliberate, on a blocking thread") }).await?;
                Ok::<_, ApiError>(n.to_string())
            }),
        )
        .route("/ok", get(|| async { "ok" }))
        .layer(axum::middleware::from_fn_with_state(st.clone(), catch_panic))
        .layer(axum::middleware::from_fn_with_state(st.clone(), observe))
        .with_state(st.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let c = reqwest::Client::new();
    for path in ["/panic", "/panic_blocking"] {
        let r = c.get(format!("http://{addr}{path}")).send().await.unwrap();
        assert_eq!(r.status(), 500, "{path}");
        let body = r.text().await.unwrap();
        assert!(body.contains("\"errorType\":\"internal\"") && body.contains("deliberate"), "{body}");
    }
    let r = c.get(format!("http://{addr}/ok")).send().await.unwrap();
    assert_eq!(r.text().await.unwrap(), "ok");
    assert_eq!(st.metrics.handler_panics.load(Ordering::Relaxed), 2);
}
