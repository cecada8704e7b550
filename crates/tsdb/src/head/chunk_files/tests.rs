use super::*;
use crate::vfs::OsFs;
use proptest::prelude::*;

fn open(dir: &Path) -> (ChunkFiles, Loaded) {
    ChunkFiles::open(OsFs::shared(), dir).unwrap()
}

/// Writes one file of `(series, mint, maxt, data)` chunks; returns the mapping.
fn write(files: &ChunkFiles, chunks: &[(u64, i64, i64, Vec<u8>)]) -> Arc<Bytes> {
    let mut w = files.writer().unwrap();
    for (r, a, b, d) in chunks {
        let p = w.add(SeriesRef(*r), *a, *b, d).unwrap();
        assert_eq!(p.len, d.len());
    }
    w.finish().unwrap().unwrap()
}

fn summary(loaded: &Loaded) -> Vec<(u64, i64, i64, Vec<u8>)> {
    let mut out: Vec<_> =
        loaded.iter().flat_map(|(r, cs)| cs.iter().map(move |c| (r.0, c.mint, c.maxt, c.data.to_vec()))).collect();
    out.sort();
    out
}

#[test]
fn chunks_written_are_mapped_where_the_writer_said_and_read_back_at_open() {
    let tmp = tempfile::tempdir().unwrap();
    let chunks = vec![(1, 0, 10, vec![1, 2, 3]), (2, 5, 7, vec![9; 300]), (1, 11, 20, vec![4])];
    {
        let (files, loaded) = open(tmp.path());
        assert!(loaded.is_empty());
        let mut w = files.writer().unwrap();
        let placed: Vec<Placed> = chunks.iter().map(|(r, a, b, d)| w.add(SeriesRef(*r), *a, *b, d).unwrap()).collect();
        let mapped = w.finish().unwrap().unwrap();
        for (p, c) in placed.iter().zip(&chunks) {
            assert_eq!(&mapped[p.start..p.start + p.len], &c.3[..]);
        }
        assert_eq!(files.usage(), (1, mapped.len() as u64));
        // Nothing added: no file.
        assert!(files.writer().unwrap().finish().unwrap().is_none());
        assert_eq!(files.usage().0, 1);
    }
    let (files, loaded) = open(tmp.path());
    assert_eq!(summary(&loaded), {
        let mut c = chunks.clone();
        c.sort();
        c
    });
    // Series 1's chunks in time order.
    assert_eq!(loaded[&SeriesRef(1)].iter().map(|c| c.mint).collect::<Vec<_>>(), vec![0, 11]);
    // A new file gets the next name.
    write(&files, &[(3, 1, 1, vec![7])]);
    assert!(tmp.path().join(file_name(1)).exists());
}

#[test]
fn unfinished_files_are_removed_and_old_files_go_once_the_head_is_cut_past_them() {
    let tmp = tempfile::tempdir().unwrap();
    let (files, _) = open(tmp.path());
    write(&files, &[(1, 0, 10, vec![1])]);
    write(&files, &[(1, 11, 20, vec![2]), (2, 0, 30, vec![3])]);
    std::fs::write(tmp.path().join("00000009.tmp"), b"half").unwrap();
    assert_eq!(files.remove_before(11).unwrap(), 1);
    assert_eq!(files.remove_before(30).unwrap(), 0);
    assert_eq!(files.usage().0, 1);
    drop(files);
    let (files, loaded) = open(tmp.path());
    assert!(!tmp.path().join("00000009.tmp").exists());
    assert_eq!(summary(&loaded), vec![(1, 11, 20, vec![2]), (2, 0, 30, vec![3])]);
    assert_eq!(files.remove_before(31).unwrap(), 1);
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
}

#[test]
fn a_damaged_file_keeps_its_intact_chunks_in_a_new_file_and_is_set_aside() {
    let tmp = tempfile::tempdir().unwrap();
    {
        let (files, _) = open(tmp.path());
        write(&files, &[(1, 0, 10, vec![1, 1]), (2, 0, 10, vec![2, 2]), (3, 0, 10, vec![3, 3])]);
    }
    // Flip a data byte of the second entry.
    let path = tmp.path().join(file_name(0));
    let mut bytes = std::fs::read(&path).unwrap();
    let second = HEADER_BYTES + ENTRY_HEAD_BYTES + 2 + CRC_BYTES;
    bytes[second + ENTRY_HEAD_BYTES] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    let (entries, err) = parse(&bytes);
    assert_eq!(entries.len(), 1);
    assert_eq!(err, Some(FileError::Entry { offset: second, reason: "checksum mismatch".into() }));

    let (files, loaded) = open(tmp.path());
    assert_eq!(summary(&loaded), vec![(1, 0, 10, vec![1, 1])]);
    assert!(tmp.path().join(format!("{}{CORRUPT_SUFFIX}", file_name(0))).exists());
    assert!(!path.exists());
    assert_eq!(files.usage().0, 1);
    drop(files);
    // The copy reads back on the next open too.
    let (_, loaded) = open(tmp.path());
    assert_eq!(summary(&loaded), vec![(1, 0, 10, vec![1, 1])]);
}

#[test]
fn overlapping_copies_of_a_series_chunks_keep_the_first() {
    let tmp = tempfile::tempdir().unwrap();
    let (files, _) = open(tmp.path());
    write(&files, &[(1, 0, 10, vec![1]), (1, 11, 20, vec![2])]);
    write(&files, &[(1, 5, 25, vec![3]), (1, 21, 30, vec![4])]);
    drop(files);
    let (_, loaded) = open(tmp.path());
    assert_eq!(summary(&loaded), vec![(1, 0, 10, vec![1]), (1, 11, 20, vec![2]), (1, 21, 30, vec![4])]);
}

#[test]
fn headers_of_other_files_are_refused_by_name() {
    assert!(matches!(parse(b"STH"), (v, Some(FileError::Header(_))) if v.is_empty()));
    assert!(matches!(parse(b"STWL\x01\0\0\0"), (_, Some(FileError::Header(m))) if m.contains("magic")));
    assert!(matches!(parse(b"STHC\x07\0\0\0"), (_, Some(FileError::Header(m))) if m.contains("version 7")));
    assert_eq!(parse(b"STHC\x01\0\0\0"), (vec![], None));
}

proptest! {
    #[test]
    fn parsing_arbitrary_bytes_never_panics(tail in proptest::collection::vec(any::<u8>(), 0..300)) {
        let mut bytes = b"STHC\x01\0\0\0".to_vec();
        bytes.extend_from_slice(&tail);
        let (entries, _) = parse(&bytes);
        for e in entries {
            prop_assert!(e.start + e.len <= bytes.len());
        }
    }
}

/// The worked example of `docs/format/chunks_head.md`: a file of one chunk, series 3, one float
/// sample (1000 ms, 1.5) in an XOR chunk.
#[test]
fn doc_example_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let (files, _) = open(tmp.path());
    let mut app = crate::chunkenc::XorAppender::with_capacity(16);
    app.append(1000, 1.5);
    write(&files, &[(3, 1000, 1000, app.bytes().to_vec())]);
    let bytes = std::fs::read(tmp.path().join(file_name(0))).unwrap();
    let got: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(got, crate::block::tests::doc_example_hex("chunks_head.md", "chunks-head-example"), "{}", got.join(" "));
}
