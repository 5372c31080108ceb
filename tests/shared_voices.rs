//! Voices shared by servers: two front ends (or two real servers, `server::serve_on` on loopback
//! in this process) over one custom-voice directory, as replicas on a ReadWriteMany volume. Each
//! has its own store, read from disk: a voice made through one speaks through the other, a
//! deletion is seen by the other's next lookup, two creations of one name at once make exactly
//! one voice, a bad file is skipped with one warning per state, a lookup that misses lists only a
//! directory that may have changed and parses no unchanged file again, and a change behind a
//! writer that holds the store's lock too long is refused (503) without writing anything.
//!
//! No test sleeps to let something happen: every change is made before the lookup that must see
//! it, and the one time bound (a listing's revalidation) is polled with a deadline.

mod common;

use std::io::{Cursor, Write as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use onebit_tts::package::ModelPackage;
use onebit_tts::synth::FrontEnd;
use onebit_tts::voice::{
    CustomVoice, REVALIDATE, StoreLock, Voice, VoiceError, VoiceStore, read_voice,
};

fn voice(name: &str, id: &str, first_code: u32) -> Voice {
    Voice {
        name: name.into(),
        language: "en-us".into(),
        transcript: "A shared voice.".into(),
        codes: (first_code..first_code + 40).collect(),
        source: "tests/shared_voices.rs".into(),
        license: "test".into(),
        custom: Some(CustomVoice {
            id: id.into(),
            created_at: 1,
            consent: "cons_00".into(),
        }),
    }
}

/// A front end as `serve` makes one: the store first, the shipped voices after it.
fn front(store: &Path) -> FrontEnd {
    let pkg = ModelPackage::load(&common::model("tiny"), None).unwrap();
    let dirs = [store.to_path_buf(), common::repo().join("voices")];
    FrontEnd::new(pkg, VoiceStore::open(&dirs).unwrap())
}

/// Makes a voice as the server does: under the store's lock, its name checked against the store
/// as the disk has it, saved without replacing a file, then offered.
fn create(front: &FrontEnd, store: &Path, v: &Voice) -> Result<PathBuf, VoiceError> {
    let _lock = StoreLock::acquire(store)?;
    if let Some(p) = front.voices().path_of(&v.name) {
        return Err(VoiceError::Exists(p.to_path_buf()));
    }
    let path = VoiceStore::save(store, v, false)?;
    front.update_voices(|s| s.insert(v.clone(), path.clone()));
    Ok(path)
}

fn delete(front: &FrontEnd, store: &Path, name: &str) {
    let _lock = StoreLock::acquire(store).unwrap();
    VoiceStore::remove(store, name).unwrap();
    front.update_voices(|s| {
        s.forget(name);
    });
}

fn unknown(front: &FrontEnd, name: &str) -> bool {
    matches!(front.voices().get(name), Err(VoiceError::Unknown { .. }))
}

#[test]
fn a_voice_made_through_one_front_end_is_seen_by_the_other() {
    let store = common::tempdir("shared-voices-ab").join("custom");
    let (a, b) = (front(&store), front(&store));
    assert!(unknown(&b, "ana"));

    // Made through A: B's next lookup (a miss) reads the store again.
    let ana = voice("ana", "voice_00000000000000000000000a", 100);
    create(&a, &store, &ana).unwrap();
    assert_eq!(*b.voices().get("ana").unwrap(), ana);
    assert_eq!(
        *b.voices().get("voice_00000000000000000000000a").unwrap(),
        ana
    );
    assert!(b.voices().names().contains(&"ana".to_owned()));
    assert_eq!(b.voices().path_of("ana").unwrap(), store.join("ana.json"));

    // Deleted through A: B's next lookup finds the file gone (one stat) and says unknown, by
    // name and by id, and lists it no more.
    let held = b.voices();
    delete(&a, &store, "ana");
    assert!(unknown(&b, "ana"));
    assert!(unknown(&b, "voice_00000000000000000000000a"));
    assert!(!b.voices().names().contains(&"ana".to_owned()));
    // A request that took its voice before goes on with it.
    assert!(held.iter().any(|(v, _)| *v == ana));

    // Made again through B with other codes: A's lookup (a hit on a changed file) sees the new one.
    let ana2 = voice("ana", "voice_00000000000000000000000b", 200);
    create(&b, &store, &ana2).unwrap();
    assert_eq!(*a.voices().get("ana").unwrap(), ana2);
    assert!(unknown(&a, "voice_00000000000000000000000a"));

    // A name another server took meanwhile is refused with the duplicate's error.
    let err = create(
        &a,
        &store,
        &voice("ana", "voice_00000000000000000000000c", 300),
    );
    assert!(
        matches!(err, Err(VoiceError::Exists(ref p)) if *p == store.join("ana.json")),
        "{err:?}"
    );
}

#[test]
fn shipped_voices_win_over_a_custom_voice_of_their_name() {
    let store = common::tempdir("shared-voices-shipped").join("custom");
    let shipped_path = common::repo().join("voices/dave.json");
    let shipped = read_voice(&shipped_path).unwrap();
    // A file of that name in the store, put there before the start and after it (by hand: the
    // server refuses the name).
    VoiceStore::save(
        &store,
        &voice("dave", "voice_0000000000000000000000d0", 100),
        false,
    )
    .unwrap();
    let a = front(&store);
    VoiceStore::save(
        &store,
        &voice("jo", "voice_0000000000000000000000d1", 100),
        false,
    )
    .unwrap();
    let b = front(&store);
    for f in [&a, &b] {
        for (name, id) in [("dave", "d0"), ("jo", "d1")] {
            let voices = f
                .voices()
                .refreshed(Duration::ZERO)
                .map_or_else(|| f.voices(), Arc::new);
            let path = common::repo().join(format!("voices/{name}.json"));
            assert_eq!(*voices.get(name).unwrap(), read_voice(&path).unwrap());
            assert_eq!(voices.path_of(name).unwrap(), path);
            assert_eq!(voices.iter().filter(|(v, _)| v.name == name).count(), 1);
            // The custom voice's id finds nothing: the voice behind it is hidden.
            assert!(
                voices
                    .get(&format!("voice_0000000000000000000000{id}"))
                    .is_err()
            );
        }
    }
    assert_eq!(*a.voices().get("dave").unwrap(), shipped);
}

#[test]
fn a_listing_follows_the_directory_within_the_revalidation_bound() {
    let store = common::tempdir("shared-voices-listing").join("custom");
    let (a, b) = (front(&store), front(&store));
    let before = b.voices().disk_reads();
    // Listings in a burst cost no more than a read per REVALIDATE (two directories each).
    let burst = Instant::now();
    for _ in 0..1000 {
        assert!(!b.voices().names().is_empty());
    }
    let reads = b.voices().disk_reads().listings - before.listings;
    let bound = 2 * (burst.elapsed().as_secs_f64() / REVALIDATE.as_secs_f64()).ceil() as u64 + 2;
    assert!(reads <= bound, "{reads} listings for 1000 snapshots");

    // Made through A, with no lookup through B: B's listing shows it within REVALIDATE.
    create(
        &a,
        &store,
        &voice("bo", "voice_0000000000000000000000b0", 100),
    )
    .unwrap();
    let made = Instant::now();
    let limit = REVALIDATE + Duration::from_secs(5);
    while !b.voices().names().contains(&"bo".to_owned()) {
        assert!(
            made.elapsed() < limit,
            "B still does not list bo after {:?}",
            made.elapsed()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    delete(&a, &store, "bo");
    let gone = Instant::now();
    while b.voices().names().contains(&"bo".to_owned()) {
        assert!(gone.elapsed() < limit, "B still lists bo");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn concurrent_creations_of_one_name_make_exactly_one_voice() {
    let store = common::tempdir("shared-voices-race").join("custom");
    let fronts = [Arc::new(front(&store)), Arc::new(front(&store))];
    for round in 0..20u32 {
        let name = format!("race{round}");
        let barrier = Arc::new(Barrier::new(2));
        let threads: Vec<_> = fronts
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let (f, barrier, store) = (f.clone(), barrier.clone(), store.clone());
                let v = voice(
                    &name,
                    &format!("voice_{round:012x}{i:012x}"),
                    100 * (i as u32 + 1),
                );
                std::thread::spawn(move || {
                    barrier.wait();
                    (v.clone(), create(&f, &store, &v))
                })
            })
            .collect();
        let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let won: Vec<&Voice> = results
            .iter()
            .filter(|(_, r)| r.is_ok())
            .map(|(v, _)| v)
            .collect();
        assert_eq!(won.len(), 1, "round {round}: {results:?}");
        let path = store.join(format!("{name}.json"));
        for (_, r) in &results {
            if let Err(e) = r {
                assert!(matches!(e, VoiceError::Exists(p) if *p == path), "{e}");
            }
        }
        assert_eq!(read_voice(&path).unwrap(), *won[0]);
        for f in &fronts {
            assert_eq!(*f.voices().get(&name).unwrap(), *won[0]);
        }
    }
    // Nothing left behind but the voices and the lock file.
    let mut files: Vec<String> = std::fs::read_dir(&store)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    assert_eq!(files.len(), 21, "{files:?}");
    assert_eq!(files[0], onebit_tts::voice::LOCK_FILE);
}

/// Log lines written while `f` runs on this thread.
fn warnings_of<T>(f: impl FnOnce() -> T) -> (T, Arc<Mutex<Vec<u8>>>) {
    #[derive(Clone)]
    struct Capture(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Capture {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Arc::new(Mutex::new(Vec::new()));
    let capture = Capture(buf.clone());
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .with_writer(move || capture.clone())
        .finish();
    (tracing::subscriber::with_default(subscriber, f), buf)
}

fn count(log: &Mutex<Vec<u8>>, what: &str) -> usize {
    String::from_utf8_lossy(&log.lock().unwrap())
        .matches(what)
        .count()
}

#[test]
fn bad_files_are_skipped_with_one_warning_per_state() {
    let dir = common::tempdir("shared-voices-bad").join("custom");
    VoiceStore::save(
        &dir,
        &voice("good", "voice_000000000000000000000001", 1),
        false,
    )
    .unwrap();
    let cut = dir.join("cut.json");
    VoiceStore::save(
        &dir,
        &voice("cut", "voice_000000000000000000000002", 2),
        false,
    )
    .unwrap();
    let whole = std::fs::read(&cut).unwrap();
    std::fs::write(&cut, &whole[..whole.len() / 2]).unwrap();
    let corrupt = dir.join("corrupt.json");
    std::fs::write(&corrupt, b"{\"name\": \"corrupt\", \"codes\": [1, 2").unwrap();
    // A voice in a file of another name.
    std::fs::copy(dir.join("good.json"), dir.join("misnamed.json")).unwrap();
    // A writer's temporary files: never voices, never warned about.
    std::fs::write(dir.join(".x.json.1-0.tmp"), b"{").unwrap();
    std::fs::write(dir.join("y.json.partial"), b"{").unwrap();

    let (store, log) = warnings_of(|| {
        let store = VoiceStore::open(std::slice::from_ref(&dir)).unwrap();
        // Misses read the directory again, and parse no bad file again.
        for _ in 0..5 {
            assert!(matches!(store.get("cut"), Err(VoiceError::Unknown { .. })));
        }
        store
    });
    let text = String::from_utf8_lossy(&log.lock().unwrap()).into_owned();
    for file in ["cut.json", "corrupt.json", "misnamed.json"] {
        assert_eq!(count(&log, file), 1, "{file}: {text}");
    }
    assert_eq!(count(&log, "WARN"), 3, "{text}");
    assert!(
        !text.contains(".tmp") && !text.contains(".partial"),
        "{text}"
    );
    assert_eq!(store.names(), ["good"]);
    assert_eq!(store.iter().count(), 1);
    assert_eq!(store.disk_reads().parses, 4);

    // A new state of a bad file is warned about once more; a cut file made whole is a voice.
    let (_, log) = warnings_of(|| {
        std::fs::write(&corrupt, b"[\"still not a voice\"]").unwrap();
        std::fs::write(&cut, &whole).unwrap();
        assert_eq!(store.get("cut").unwrap().name, "cut");
        for _ in 0..3 {
            assert!(store.get("nobody").is_err());
        }
    });
    let text = String::from_utf8_lossy(&log.lock().unwrap()).into_owned();
    assert_eq!(count(&log, "corrupt.json"), 1, "{text}");
    assert_eq!(count(&log, "WARN"), 1, "{text}");
    let fresh = store.refreshed(Duration::ZERO).unwrap();
    assert_eq!(fresh.names(), ["cut", "good"]);
}

/// Sets a directory's mtime, as a directory last changed then looks (its ctime becomes now).
fn set_mtime(dir: &Path, t: std::time::SystemTime) {
    std::fs::File::open(dir).unwrap().set_modified(t).unwrap();
}

#[test]
fn a_miss_lists_only_a_directory_that_may_have_changed_and_parses_no_unchanged_file() {
    let dir = common::tempdir("shared-voices-misses").join("custom");
    for i in 0..30 {
        let v = voice(&format!("v{i:02}"), &format!("voice_{i:024x}"), i);
        VoiceStore::save(&dir, &v, false).unwrap();
    }
    // Changed just now (an hour ahead, so however slow this machine it stays so): the
    // directory's mtime is not settled, so every miss lists it again (a file added within the
    // same clock tick would not move it).
    set_mtime(
        &dir,
        std::time::SystemTime::now() + Duration::from_secs(3600),
    );
    let store = VoiceStore::open(std::slice::from_ref(&dir)).unwrap();
    let opened = store.disk_reads();
    assert_eq!((opened.listings, opened.parses), (1, 30));
    for _ in 0..20 {
        assert!(store.get("nobody").is_err());
    }
    let after = store.disk_reads();
    assert_eq!((after.listings, after.parses), (1 + 20, 30));

    // Last changed long ago (well past SETTLED): a miss stats the directory, lists nothing.
    let long_ago = std::time::SystemTime::now() - 10 * onebit_tts::voice::SETTLED;
    set_mtime(&dir, long_ago);
    assert!(store.get("nobody").is_err()); // its ctime moved: listed once more
    let settled = store.disk_reads();
    assert_eq!((settled.listings, settled.parses), (after.listings + 1, 30));
    for _ in 0..200 {
        assert!(store.get("nobody").is_err());
    }
    // A hit on an unchanged file lists nothing either.
    for _ in 0..200 {
        store.get("v07").unwrap();
    }
    assert_eq!(store.disk_reads(), settled);

    // Written by another server: its rename moves the directory's mtime, so the next miss lists
    // the directory and finds it, parsing that file only.
    let other = VoiceStore::open(std::slice::from_ref(&dir)).unwrap();
    let new = voice("new", "voice_0000000000000000000000ff", 7);
    VoiceStore::save(&dir, &new, false).unwrap();
    assert_eq!(*store.get("new").unwrap(), new);
    let found = store.disk_reads();
    assert_eq!((found.listings, found.parses), (settled.listings + 1, 31));
    drop(other);

    // A deletion moves it too: the next lookup of the deleted voice finds it gone.
    VoiceStore::remove(&dir, "v07").unwrap();
    assert!(matches!(store.get("v07"), Err(VoiceError::Unknown { .. })));
    assert_eq!(store.disk_reads().parses, 31);

    // A file edited in place moves no directory's mtime: the lookup that finds its voice
    // changed reads every directory again and answers with the new one.
    set_mtime(&dir, long_ago);
    assert!(store.get("nobody").is_err());
    let listed = store.disk_reads().listings;
    assert!(store.get("nobody").is_err());
    assert_eq!(store.disk_reads().listings, listed, "settled again");
    let edited = voice("v03", "voice_000000000000000000000003", 500);
    let path = dir.join("v03.json");
    let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&path).unwrap());
    std::fs::write(&path, serde_json::to_vec_pretty(&edited).unwrap()).unwrap();
    assert_eq!(
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&path).unwrap()),
        ino,
        "not edited in place"
    );
    assert_eq!(*store.get("v03").unwrap(), edited);
    assert_eq!(store.disk_reads().listings, listed + 1);

    // A file that is not a valid voice keeps its directory listed on every miss, so mending
    // it in place is seen by the next lookup.
    let bad = dir.join("mended.json");
    std::fs::write(&bad, b"{\"name\": ").unwrap();
    set_mtime(&dir, long_ago);
    assert!(store.get("mended").is_err());
    let listed = store.disk_reads().listings;
    assert!(store.get("nobody").is_err());
    assert_eq!(store.disk_reads().listings, listed + 1, "listed again");
    let mended = voice("mended", "voice_0000000000000000000000aa", 600);
    std::fs::write(&bad, serde_json::to_vec_pretty(&mended).unwrap()).unwrap();
    assert_eq!(*store.get("mended").unwrap(), mended);
}

#[test]
fn the_store_lock_is_given_up_after_its_wait_and_taken_once_free() {
    let store = common::tempdir("shared-voices-lock").join("custom");
    // Another writer (a second open file: flock locks belong to it, not to the process) holds it.
    let held = StoreLock::acquire(&store).unwrap();
    let wait = Duration::from_millis(100);
    let t0 = Instant::now();
    let err = StoreLock::acquire_within(&store, wait).unwrap_err();
    assert!(t0.elapsed() >= wait, "gave up after {:?}", t0.elapsed());
    match &err {
        VoiceError::StoreBusy { path, waited } => {
            assert_eq!(path, &store.join(onebit_tts::voice::LOCK_FILE));
            assert_eq!(*waited, wait);
        }
        other => panic!("{other:?}"),
    }
    assert!(
        err.to_string().contains("gave up after waiting 100 ms"),
        "{err}"
    );
    drop(held);
    // Free: taken at the first try, even with no wait at all.
    let _taken = StoreLock::acquire_within(&store, Duration::ZERO).unwrap();
}

// ---- Two real servers sharing a store. ----

mod servers {
    use super::*;

    use std::net::SocketAddr;

    use reqwest::{Client, StatusCode};
    use serde_json::{Value, json};
    use tokio::sync::oneshot;

    use onebit_tts::server::{ServerConfig, serve_on};
    use onebit_tts::synth::{SynthConfig, Synthesizer};

    struct Server {
        addr: SocketAddr,
        stop: Option<oneshot::Sender<()>>,
        task: tokio::task::JoinHandle<std::io::Result<()>>,
    }

    impl Server {
        /// A server of its own synthesizer (its own voice store) over `store`.
        async fn start(store: &Path) -> Self {
            Self::start_waiting(store, onebit_tts::voice::LOCK_WAIT).await
        }

        /// As `start`, waiting `lock_wait` for the store's lock (`--voice-lock-timeout-s`).
        async fn start_waiting(store: &Path, lock_wait: Duration) -> Self {
            let cfg = SynthConfig {
                package_dir: common::model("tiny"),
                voice_dirs: vec![store.to_path_buf(), common::repo().join("voices")],
                ..SynthConfig::default()
            };
            let synth = Arc::new(Synthesizer::load(&cfg).unwrap());
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let server_cfg = ServerConfig {
                addr,
                voice_store: Some(store.to_path_buf()),
                encoder: Some(common::model("tiny").join("codec/encoder.onnx")),
                encoder_required: true,
                voice_lock_wait: lock_wait,
                ..ServerConfig::default()
            };
            let (stop, stopped) = oneshot::channel::<()>();
            let task = tokio::spawn(serve_on(listener, synth, server_cfg, async move {
                let _ = stopped.await;
            }));
            Self {
                addr,
                stop: Some(stop),
                task,
            }
        }

        fn url(&self, path: &str) -> String {
            format!("http://{}{}", self.addr, path)
        }

        async fn stop(mut self) {
            let _ = self.stop.take().unwrap().send(());
            tokio::time::timeout(Duration::from_secs(60), self.task)
                .await
                .unwrap()
                .unwrap()
                .unwrap();
        }
    }

    fn form(fields: &[(&str, &str)], file: Option<(&str, &[u8])>) -> (String, Vec<u8>) {
        let boundary = "onebit-shared-voices-boundary";
        let mut body = Vec::new();
        for (name, value) in fields {
            write!(
                body,
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n"
            )
            .unwrap();
        }
        if let Some((name, bytes)) = file {
            write!(
                body,
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; \
                 filename=\"{name}.wav\"\r\nContent-Type: audio/wav\r\n\r\n"
            )
            .unwrap();
            body.extend_from_slice(bytes);
            body.extend_from_slice(b"\r\n");
        }
        write!(body, "--{boundary}--\r\n").unwrap();
        (format!("multipart/form-data; boundary={boundary}"), body)
    }

    /// One second of a 220 Hz tone at 16 kHz.
    fn tone_wav() -> Vec<u8> {
        let mut out = Cursor::new(Vec::new());
        let spec = hound::WavSpec {
            channels: 1,
            sample_rate: 16_000,
            bits_per_sample: 16,
            sample_format: hound::SampleFormat::Int,
        };
        let mut w = hound::WavWriter::new(&mut out, spec).unwrap();
        for i in 0..16_000 {
            let x = (f64::from(i) * 2.0 * std::f64::consts::PI * 220.0 / 16_000.0).sin();
            w.write_sample((x * 10_000.0) as i16).unwrap();
        }
        w.finalize().unwrap();
        out.into_inner()
    }

    async fn post_form(c: &Client, url: String, f: &(String, Vec<u8>)) -> (StatusCode, Value) {
        let r = c
            .post(url)
            .header("content-type", &f.0)
            .body(f.1.clone())
            .send()
            .await
            .unwrap();
        let status = r.status();
        (status, r.json().await.unwrap())
    }

    fn client() -> Client {
        Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(120))
            .build()
            .unwrap()
    }

    /// Keeps a consent recording for "Ana" through `s`; its id.
    async fn keep_consent(c: &Client, s: &Server) -> String {
        let wav = tone_wav();
        let consent_form = form(
            &[("name", "Ana"), ("language", "en-US")],
            Some(("recording", &wav)),
        );
        let (status, consent) =
            post_form(c, s.url("/v1/audio/voice_consents"), &consent_form).await;
        assert_eq!(status, StatusCode::OK, "{consent}");
        consent["id"].as_str().unwrap().to_owned()
    }

    /// `DELETE /v1/audio/voices/{id}` through `s`.
    async fn delete_voice(c: &Client, s: &Server, id: &str) -> reqwest::Response {
        c.delete(s.url(&format!("/v1/audio/voices/{id}")))
            .send()
            .await
            .unwrap()
    }

    /// `POST /v1/audio/voices` to the server at `base` (`http://ADDR`).
    async fn make_voice(c: &Client, base: &str, name: &str, consent: &str) -> (StatusCode, Value) {
        let wav = tone_wav();
        let f = form(
            &[
                ("name", name),
                ("consent", consent),
                ("transcript", "A tone."),
            ],
            Some(("audio_sample", &wav)),
        );
        post_form(c, format!("{base}/v1/audio/voices"), &f).await
    }

    /// The status of a greedy speech request, and its error code if any.
    async fn speak(c: &Client, s: &Server, voice: &str) -> (StatusCode, Option<String>) {
        let body = json!({"voice": voice, "input": "Hello there.", "temperature": 0,
                          "response_format": "wav"});
        let r = c
            .post(s.url("/v1/audio/speech"))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status();
        let bytes = r.bytes().await.unwrap();
        if status.is_success() {
            assert!(bytes.starts_with(b"RIFF"), "not a WAV");
            (status, None)
        } else {
            let v: Value = serde_json::from_slice(&bytes).unwrap();
            (status, v["error"]["code"].as_str().map(str::to_owned))
        }
    }

    async fn get(c: &Client, s: &Server, path: &str) -> (StatusCode, Value) {
        let r = c.get(s.url(path)).send().await.unwrap();
        let status = r.status();
        (status, r.json().await.unwrap())
    }

    fn listed(list: &Value, name: &str) -> bool {
        list["voices"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["name"] == name)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn two_servers_sharing_a_store_agree() {
        let store = common::tempdir("shared-voices-servers").join("custom");
        let (a, b) = (Server::start(&store).await, Server::start(&store).await);
        let c = client();

        // A consent kept through A is one B finds (the store's consents/ is shared as it was).
        let consent = keep_consent(&c, &a).await;
        let (status, _) = get(&c, &b, &format!("/v1/audio/voice_consents/{consent}")).await;
        assert_eq!(status, StatusCode::OK);

        // Made through A, spoken through both, by name and by id, and listed by B.
        let (status, made) = make_voice(&c, &a.url(""), "ana", &consent).await;
        assert_eq!(status, StatusCode::OK, "{made}");
        let id = made["id"].as_str().unwrap().to_owned();
        for s in [&b, &a] {
            assert_eq!(speak(&c, s, "ana").await, (StatusCode::OK, None));
            assert_eq!(speak(&c, s, &id).await, (StatusCode::OK, None));
        }
        let (status, got) = get(&c, &b, &format!("/v1/audio/voices/{id}")).await;
        assert_eq!((status, &got["name"]), (StatusCode::OK, &json!("ana")));
        let (_, list) = get(&c, &b, "/v1/audio/voices").await;
        assert!(listed(&list, "ana"), "{list}");
        assert!(
            list["data"]
                .as_array()
                .unwrap()
                .iter()
                .any(|v| v["id"] == id),
            "{list}"
        );

        // B refuses the name as a duplicate; A deletes it; B answers unknown_voice next.
        let (status, dup) = make_voice(&c, &b.url(""), "ana", &consent).await;
        assert_eq!(status, StatusCode::CONFLICT, "{dup}");
        assert_eq!(dup["error"]["code"], "voice_exists");
        assert_eq!(delete_voice(&c, &a, &id).await.status(), StatusCode::OK);
        let unknown = (StatusCode::BAD_REQUEST, Some("unknown_voice".to_owned()));
        assert_eq!(speak(&c, &b, "ana").await, unknown);
        assert_eq!(speak(&c, &b, &id).await, unknown);
        let (status, _) = get(&c, &b, &format!("/v1/audio/voices/{id}")).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        // Deleting it again through B: gone there too.
        assert_eq!(
            delete_voice(&c, &b, &id).await.status(),
            StatusCode::NOT_FOUND
        );

        // Both create one name at once: exactly one wins, the other gets the duplicate's 409.
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let racers = [&a, &b].map(|s| {
            let (c, base, barrier, consent) =
                (c.clone(), s.url(""), barrier.clone(), consent.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                make_voice(&c, &base, "both", &consent).await
            })
        });
        let mut results = Vec::new();
        for r in racers {
            results.push(r.await.unwrap());
        }
        let mut statuses: Vec<u16> = results.iter().map(|(s, _)| s.as_u16()).collect();
        statuses.sort_unstable();
        assert_eq!(statuses, [200, 409], "{results:?}");
        let loser = results
            .iter()
            .find(|(s, _)| *s == StatusCode::CONFLICT)
            .unwrap();
        assert_eq!(loser.1["error"]["code"], "voice_exists");
        let winner = &results.iter().find(|(s, _)| s.is_success()).unwrap().1;
        for s in [&a, &b] {
            let (status, got) = get(&c, s, "/v1/audio/voices/both").await;
            assert_eq!((status, &got["id"]), (StatusCode::OK, &winner["id"]));
            assert_eq!(speak(&c, s, "both").await, (StatusCode::OK, None));
        }

        a.stop().await;
        b.stop().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_change_behind_a_held_store_lock_answers_503_and_writes_nothing() {
        let store = common::tempdir("shared-voices-held").join("custom");
        let s = Server::start_waiting(&store, Duration::from_millis(50)).await;
        let c = client();
        let consent = keep_consent(&c, &s).await;
        let (status, ana) = make_voice(&c, &s.url(""), "ana", &consent).await;
        assert_eq!(status, StatusCode::OK, "{ana}");
        let ana_id = ana["id"].as_str().unwrap().to_owned();
        let ana_file = std::fs::read(store.join("ana.json")).unwrap();

        // Another server's writer, stuck while it holds the lock.
        let held = StoreLock::acquire(&store).unwrap();
        let busy = |status: StatusCode, body: &Value| {
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
            assert_eq!(body["error"]["code"], "voice_store_busy", "{body}");
            let msg = body["error"]["message"].as_str().unwrap();
            assert!(msg.contains("gave up after waiting 50 ms"), "{msg}");
        };
        let (status, made) = make_voice(&c, &s.url(""), "bob", &consent).await;
        busy(status, &made);
        assert!(!store.join("bob.json").exists());
        let r = delete_voice(&c, &s, &ana_id).await;
        assert_eq!(r.headers()["retry-after"], "1");
        let status = r.status();
        busy(status, &r.json().await.unwrap());
        assert_eq!(std::fs::read(store.join("ana.json")).unwrap(), ana_file);
        // Still serving meanwhile, the voice that was not deleted too.
        assert_eq!(speak(&c, &s, "ana").await, (StatusCode::OK, None));

        drop(held);
        let (status, made) = make_voice(&c, &s.url(""), "bob", &consent).await;
        assert_eq!(status, StatusCode::OK, "{made}");
        assert_eq!(speak(&c, &s, "bob").await, (StatusCode::OK, None));
        assert_eq!(delete_voice(&c, &s, &ana_id).await.status(), StatusCode::OK);
        assert!(!store.join("ana.json").exists());
        s.stop().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn changes_queued_behind_a_stuck_writer_each_give_up_after_the_wait() {
        let store = common::tempdir("shared-voices-queued").join("custom");
        let wait = Duration::from_secs(1);
        let s = Server::start_waiting(&store, wait).await;
        let c = client();
        // Serving (its start, the encoder's load, is not part of what is timed below).
        let (status, _) = get(&c, &s, "/v1/audio/voices").await;
        assert_eq!(status, StatusCode::OK);
        let held = StoreLock::acquire(&store).unwrap();
        // Six changes at once: one waits for the file lock, five for this server's turn. Each
        // answers once the wait has passed since it came, not a wait after the one before it
        // (6 s for the last).
        let t0 = Instant::now();
        let deletes: Vec<_> = (0..6)
            .map(|i| {
                let (c, url) = (
                    c.clone(),
                    s.url(&format!("/v1/audio/voices/voice_{i:024x}")),
                );
                tokio::spawn(async move {
                    let r = c.delete(url).send().await.unwrap();
                    let status = r.status();
                    let body: Value = r.json().await.unwrap();
                    (status, body, t0.elapsed())
                })
            })
            .collect();
        let mut last = Duration::ZERO;
        for d in deletes {
            let (status, body, took) = d.await.unwrap();
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
            assert_eq!(body["error"]["code"], "voice_store_busy", "{body}");
            assert!(took >= wait, "answered after {took:?}");
            last = last.max(took);
        }
        assert!(last < 3 * wait, "the last answered after {last:?}");
        drop(held);
        s.stop().await;
    }
}
