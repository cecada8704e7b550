mod promqltest;
#[test]
fn scratch() {
    let text = std::fs::read_to_string("/tmp/scratch.test").unwrap();
    for r in promqltest::run_file(&text).unwrap() {
        println!("{} {} {:?}", r.line, r.query, r.outcome);
    }
}
