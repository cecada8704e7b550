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
