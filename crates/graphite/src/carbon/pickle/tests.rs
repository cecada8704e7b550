//! Messages pickled by Python 3's `pickle.dumps(points, protocol=N)` for every protocol, and
//! hostile ones.

use super::*;

const NOW: i64 = 1_700_000_123_456;

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// `[("sys.cpu.load", (1700000000, 0.5)), ("sys.cpu.load", (1700000010.25, 1)),
///   ("disk.used;host=a;dc=eu", (1700000000, 3.0)), ("a.b", (-1, "2.5")),
///   ("a.nan", (1700000000, float("nan"))), ("bad", (1,)), ("big", (2**70, 1))]`
/// pickled with protocols 0 to 5.
const BY_PROTOCOL: [&str; 6] = [
    "286c70300a28567379732e6370752e6c6f61640a70310a2849313730303030303030300a46302e350a7470320a7470330a612867310a2846313730303030303031302e32350a49310a7470340a7470350a6128566469736b2e757365643b686f73743d613b64633d65750a70360a2849313730303030303030300a46332e300a7470370a7470380a612856612e620a70390a28492d310a56322e350a7031300a747031310a747031320a612856612e6e616e0a7031330a2849313730303030303030300a466e616e0a747031340a747031350a6128566261640a7031360a2849310a747031370a747031380a6128566269670a7031390a284c313138303539313632303731373431313330333432344c0a49310a747032300a747032310a612e",
    "5d71002828580c0000007379732e6370752e6c6f61647101284a00f15365473fe0000000000000747102747103286801284741d954fc429000004b017471047471052858160000006469736b2e757365643b686f73743d613b64633d65757106284a00f15365474008000000000000747107747108285803000000612e627109284affffffff5803000000322e35710a74710b74710c285805000000612e6e616e710d284a00f15365477ff800000000000074710e74710f2858030000006261647110284b017471117471122858030000006269677113284c313138303539313632303731373431313330333432344c0a4b01747114747115652e",
    "80025d710028580c0000007379732e6370752e6c6f616471014a00f15365473fe000000000000086710286710368014741d954fc429000004b0186710486710558160000006469736b2e757365643b686f73743d613b64633d657571064a00f153654740080000000000008671078671085803000000612e6271094affffffff5803000000322e35710a86710b86710c5805000000612e6e616e710d4a00f15365477ff800000000000086710e86710f580300000062616471104b01857111867112580300000062696771138a090000000000000000404b01867114867115652e",
    "80035d710028580c0000007379732e6370752e6c6f616471014a00f15365473fe000000000000086710286710368014741d954fc429000004b0186710486710558160000006469736b2e757365643b686f73743d613b64633d657571064a00f153654740080000000000008671078671085803000000612e6271094affffffff5803000000322e35710a86710b86710c5805000000612e6e616e710d4a00f15365477ff800000000000086710e86710f580300000062616471104b01857111867112580300000062696771138a090000000000000000404b01867114867115652e",
    "800495b4000000000000005d94288c0c7379732e6370752e6c6f6164944a00f15365473fe00000000000008694869468014741d954fc429000004b01869486948c166469736b2e757365643b686f73743d613b64633d6575944a00f15365474008000000000000869486948c03612e62944affffffff8c03322e3594869486948c05612e6e616e944a00f15365477ff8000000000000869486948c03626164944b01859486948c03626967948a090000000000000000404b0186948694652e",
    "800595b4000000000000005d94288c0c7379732e6370752e6c6f6164944a00f15365473fe00000000000008694869468014741d954fc429000004b01869486948c166469736b2e757365643b686f73743d613b64633d6575944a00f15365474008000000000000869486948c03612e62944affffffff8c03322e3594869486948c05612e6e616e944a00f15365477ff8000000000000869486948c03626164944b01859486948c03626967948a090000000000000000404b0186948694652e",
];

#[test]
fn every_protocol_decodes_to_the_same_points() {
    for (proto, h) in BY_PROTOCOL.iter().enumerate() {
        let got = decode(&hex(h), NOW).unwrap_or_else(|e| panic!("protocol {proto}: {e}"));
        assert_eq!(got.len(), 7, "protocol {proto}");
        let ok: Vec<(String, i64, f64)> =
            got.iter().filter_map(|r| r.as_ref().ok()).map(|p| (p.path.to_string(), p.t_ms, p.value)).collect();
        assert_eq!(
            ok,
            [
                ("sys.cpu.load".to_string(), 1_700_000_000_000, 0.5),
                ("sys.cpu.load".to_string(), 1_700_000_010_250, 1.0),
                ("disk.used;dc=eu;host=a".to_string(), 1_700_000_000_000, 3.0),
                ("a.b".to_string(), NOW, 2.5),
            ],
            "protocol {proto}"
        );
        let reasons: Vec<&str> = got.iter().filter_map(|r| r.as_ref().err()).map(PointError::reason).collect();
        assert_eq!(reasons, ["nan_value", "bad_shape", "bad_timestamp"], "protocol {proto}");
    }
}

#[test]
fn python3_bytes_paths_decode_from_protocol_3_and_globals_are_refused() {
    let got = decode(&hex("80035d7100430a62797465732e7061746871014a00f153654b07867102867103612e"), NOW).unwrap();
    assert_eq!(got[0].as_ref().unwrap().path.to_string(), "bytes.path");
    // Protocols 0-2 pickle Python 3 bytes through a call to `_codecs.encode`: a GLOBAL, which
    // carbon's safe unpickler refuses too.
    assert_eq!(decode(&hex("286c70300a28635f636f646563730a656e636f64650a70310a285662797465732e706174680a70320a566c6174696e310a70330a7470340a5270350a2849313730303030303030300a49370a7470360a7470370a612e"), NOW), Err(PickleError::Opcode(b'c', 6)));
}

#[test]
fn hostile_pickles_are_refused_without_harm() {
    // Arbitrary calls: GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, persistent ids, STACK_GLOBAL.
    for op in [b'c', b'R', b'b', b'i', b'o', 0x81, b'P', b'Q', 0x93] {
        assert!(matches!(decode(&[0x80, 2, op], NOW), Err(PickleError::Opcode(o, 2)) if o == op), "{op:#x}");
    }
    // Nesting: ]]]]…aaaa.
    let mut deep = vec![b']'; 10_000];
    deep.extend(std::iter::repeat_n(b'a', 9_999));
    deep.push(b'.');
    assert_eq!(decode(&deep, NOW), Err(PickleError::TooDeep));
    // A memo bomb: a list doubled by fetching it twice, over and over.
    let mut bomb = vec![b']', b'K', 1, b'a'];
    for _ in 0..40 {
        bomb.extend([b'q', 0, b'(', b'h', 0, b'h', 0, b'l']);
    }
    bomb.push(b'.');
    assert!(matches!(decode(&bomb, NOW), Err(PickleError::MemoBudget | PickleError::TooDeep)));
    // Copies: a long list, shared through the memo and appended to over and over (each append
    // to a shared list copies it).
    let mut copies = vec![b']', b'('];
    for _ in 0..10_000 {
        copies.extend([b'K', 1]);
    }
    copies.push(b'e');
    for _ in 0..50 {
        copies.extend([b'q', 0, b'h', 0, b'K', 1, b'a']);
    }
    copies.push(b'.');
    assert_eq!(decode(&copies, NOW), Err(PickleError::MemoBudget));
    // Lengths past the end, a missing STOP, an empty stack, not a list.
    assert_eq!(decode(&[b'X', 0xff, 0xff, 0xff, 0x7f], NOW), Err(PickleError::Truncated));
    assert_eq!(decode(b"]", NOW), Err(PickleError::Truncated));
    assert!(matches!(decode(b".", NOW), Err(PickleError::Malformed(_, "stack underflow"))));
    assert_eq!(decode(&[b'K', 1, b'.'], NOW), Err(PickleError::NotAList));
    assert!(matches!(decode(b"a.", NOW), Err(PickleError::Malformed(..))));
}

#[test]
fn long_integers_of_any_width() {
    assert_eq!(long_le(&[]), Val::Int(0));
    assert_eq!(long_le(&[0xff]), Val::Int(-1));
    assert_eq!(long_le(&[0x00, 0xf1, 0x53, 0x65]), Val::Int(1_700_000_000));
    assert_eq!(long_le(&[0, 0, 0, 0, 0, 0, 0, 0, 0x40]), Val::Float(2f64.powi(70)));
    assert_eq!(long_le(&[0xff; 9]), Val::Float(-1.0));
}

proptest::proptest! {
    #[test]
    fn any_bytes_decode_or_fail_without_panic(data in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
        let _ = decode(&data, NOW);
    }
}
