//! The state directory against the tiny fixture model: a state saved by one store resumes,
//! bit for bit, in a store opened later (a restart); corrupt, truncated and foreign files are
//! refused and the directory stays within its cap.

use super::*;
use crate::model::linear::DenseFormat;
use crate::model::{Logits, Model, SequenceState};
use std::time::{Duration, Instant};

const ID: [u8; 32] = [7; 32];

fn model() -> Model {
    crate::model::fixture_model("tiny", DenseFormat::Bf16)
}

fn prompt(model: &Model, n: usize, salt: u32) -> Vec<u32> {
    let vocab = model.config().vocab_size as u32;
    (0..n as u32).map(|t| (t * 13 + salt) % vocab).collect()
}

fn open(model: &Model, dir: &Path, cap: u64, id: [u8; 32]) -> PrefixStore {
    PrefixStore::open(
        dir,
        cap,
        id,
        Layout::of(model),
        4096,
        1 << 30,
        StoreStats::default(),
    )
    .expect("store opens")
}

/// Prefills `tokens` and saves the state, waiting for the writer.
fn save(model: &Model, store: &mut PrefixStore, tokens: &[u32]) -> SequenceState {
    let mut st = model.new_state();
    model
        .forward(&mut st, tokens, Logits::Last, None)
        .expect("prefill");
    if store.wants(tokens, st.bytes()) {
        store.save(tokens, st.kv_rows(0..tokens.len()), st.recurrent_snapshot());
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while !store.idle() {
        assert!(Instant::now() < deadline, "writer finished");
        std::thread::sleep(Duration::from_millis(5));
    }
    st
}

fn state_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "state"))
        .collect();
    v.sort();
    v
}

fn dir_bytes(dir: &Path) -> u64 {
    state_files(dir)
        .iter()
        .map(|p| p.metadata().expect("meta").len())
        .sum()
}

#[test]
fn a_saved_state_resumes_after_a_restart_bit_for_bit() {
    let model = model();
    let tmp = tempfile::tempdir().expect("tmp");
    let p = prompt(&model, 150, 3);
    let mut store = open(&model, tmp.path(), 1 << 30, ID);
    let mut original = save(&model, &mut store, &p[..100]);
    let files = state_files(tmp.path());
    assert_eq!(files.len(), 1);
    let job_len = files[0].metadata().expect("meta").len();
    drop(store);

    let mut store = open(&model, tmp.path(), 1 << 30, ID);
    assert!(
        store.find(&p[..100], 0).is_none(),
        "a state equal to the prompt leaves nothing to run"
    );
    assert!(
        store.find(&p, 100).is_none(),
        "nothing longer than 100 is saved"
    );
    let saved = store.find(&p, 0).expect("found after the restart");
    assert_eq!(saved.tokens, &p[..100]);
    let mut resumed = SequenceState::resume(&[&saved.kv], &saved.recurrent).expect("fits");
    let a = model
        .forward(&mut original, &p[100..], Logits::Last, None)
        .expect("forward");
    let b = model
        .forward(&mut resumed, &p[100..], Logits::Last, None)
        .expect("forward");
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&a), bits(&b));
    assert_eq!(store.stats().loaded.get(), 1);
    // The size the writer reserves is the size it writes.
    let job = Job {
        name: String::new(),
        tokens: saved.tokens.clone(),
        kv: saved.kv,
        recurrent: saved.recurrent,
        bytes: 0,
    };
    assert_eq!(file_len(&job), job_len);
}

/// Damages the one state file in `dir` with `damage`, then checks a new store refuses it,
/// counts it, and (`deleted`) removes it.
fn check_refused(damage: impl Fn(&Path), deleted: bool, id: [u8; 32]) {
    let model = model();
    let tmp = tempfile::tempdir().expect("tmp");
    let p = prompt(&model, 90, 5);
    let mut store = open(&model, tmp.path(), 1 << 30, ID);
    save(&model, &mut store, &p[..80]);
    drop(store);
    let file = state_files(tmp.path()).remove(0);
    damage(&file);
    let mut store = open(&model, tmp.path(), 1 << 30, id);
    assert!(
        store.find(&p, 0).is_none(),
        "a damaged or foreign state is never served"
    );
    assert_eq!(store.stats().refused.get(), 1);
    assert_eq!(file.exists(), !deleted);
    assert!(store.find(&p, 0).is_none());
    assert_eq!(store.stats().refused.get(), 1, "counted once");
}

#[test]
fn a_corrupt_file_is_refused_and_deleted() {
    check_refused(
        |f| {
            let mut bytes = std::fs::read(f).expect("read");
            let mid = bytes.len() / 2;
            bytes[mid] ^= 0x40;
            std::fs::write(f, bytes).expect("write");
        },
        true,
        ID,
    );
}

#[test]
fn a_truncated_file_is_refused_and_deleted() {
    check_refused(
        |f| {
            let len = f.metadata().expect("meta").len();
            File::options()
                .write(true)
                .open(f)
                .expect("open")
                .set_len(len - 100)
                .expect("truncate");
        },
        true,
        ID,
    );
}

#[test]
fn a_file_of_another_identity_is_skipped_and_kept() {
    let mut other = ID;
    other[0] ^= 1;
    check_refused(|_| {}, false, other);
}

#[test]
fn the_directory_stays_within_its_cap_and_evicts_the_least_recently_used() {
    let model = model();
    let tmp = tempfile::tempdir().expect("tmp");
    let mut probe = open(&model, tmp.path(), 1 << 30, ID);
    save(&model, &mut probe, &prompt(&model, 60, 100));
    let one = dir_bytes(tmp.path());
    std::fs::remove_file(&state_files(tmp.path())[0]).expect("rm");
    drop(probe);
    // Room for two states of 60 tokens, not three.
    let cap = one * 2 + one / 2;
    let mut store = open(&model, tmp.path(), cap, ID);
    let prompts: Vec<Vec<u32>> = (0..5).map(|s| prompt(&model, 61, s)).collect();
    for (i, p) in prompts.iter().enumerate() {
        save(&model, &mut store, &p[..60]);
        assert!(
            dir_bytes(tmp.path()) <= cap,
            "after save {i}: {} > {cap}",
            dir_bytes(tmp.path())
        );
        if i == 1 {
            // Using the first state makes the second the least recently used.
            std::thread::sleep(Duration::from_millis(20));
            assert!(store.find(&prompts[0], 0).is_some());
        }
        if i == 2 {
            assert!(
                store.find(&prompts[1], 0).is_none(),
                "the least recently used went"
            );
            assert!(
                store.find(&prompts[0], 0).is_some(),
                "the one used lately stayed"
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(state_files(tmp.path()).len(), 2);
    assert!(store.stats().evicted.get() >= 3);
    let mut oversized = open(&model, tmp.path(), one - 1, ID);
    save(&model, &mut oversized, &prompt(&model, 60, 77));
    assert!(
        oversized.stats().skipped.get() >= 1,
        "a state over the cap is not written"
    );
}

#[test]
fn an_unchanged_directory_is_not_read_again_and_a_new_file_is_seen() {
    let model = model();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut a = open(&model, dir.path(), 1 << 30, ID);
    let p = prompt(&model, 40, 1);
    save(&model, &mut a, &p);
    // A second hostd sharing the directory.
    let mut b = open(&model, dir.path(), 1 << 30, ID);
    let scans = b.scans;
    let longer = |t: &[u32]| t.iter().copied().chain([1, 2, 3]).collect::<Vec<u32>>();
    assert!(b.find(&longer(&p), 0).is_some());
    assert!(b.find(&longer(&p), 0).is_some());
    assert_eq!(b.scans, scans, "an unchanged directory is not read again");
    // The other one saves a state: the directory changes and the next lookup sees the file.
    std::thread::sleep(Duration::from_millis(20));
    let q = prompt(&model, 40, 2);
    save(&model, &mut a, &q);
    assert!(
        b.find(&longer(&q), 0).is_some(),
        "a file another process wrote is found"
    );
    assert_eq!(b.scans, scans + 1);
}
