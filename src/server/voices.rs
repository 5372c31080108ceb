//! OpenAI's custom-voice API: consent recordings (`/v1/audio/voice_consents`) and voices cloned
//! from an uploaded sample (`/v1/audio/voices`), with our one extension the model needs: the
//! sample's exact `transcript`. Uploads are `multipart/form-data`, read whole within the upload
//! limit; the audio is decoded by symphonia and encoded by the configured NeuCodec encoder on a
//! blocking thread; the voice is saved atomically in the voice store, under the store's file lock
//! that every server sharing the store takes, and usable at once (by those servers too: their
//! lookups read the store again on a miss).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Path as UrlPath, Query, Request, State};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::AppState;
use super::errors::ApiError;
use super::schema::read_limited;
use crate::audio::AudioError;
use crate::audio::decode::{DecodedAudio, decode_bytes_within};
use crate::codec::encoder::{CodecEncoder, ENCODER_NEEDED};
use crate::synth::SynthError;
use crate::text::Language;
use crate::voice::clone::{CloneError, CloneSpec, clone_voice};
use crate::voice::consent::{Consent, ConsentError, ConsentStore};
use crate::voice::{CustomVoice, StoreLock, Voice, VoiceError};

/// Shortest sample that carries a voice; the vendor recommends 3-15 s.
pub const MIN_SAMPLE_SECONDS: f64 = 1.0;
/// Longest sample taken: past 15 s a reference mostly takes context from the text to speak.
pub const MAX_SAMPLE_SECONDS: f64 = 30.0;
/// Longest consent recording kept.
pub const MAX_CONSENT_SECONDS: u32 = 60;
/// Uploads read, decoded and encoded at once; the rest wait (each holds up to the upload limit
/// and its decoded samples in memory).
const UPLOADS_AT_ONCE: usize = 2;
/// Room in an upload's body for its text fields and multipart framing, past the file limit.
const FORM_OVERHEAD: usize = 64 << 10;

/// What cloning needs, found once at start: the store and the encoder (or why there is none).
pub(crate) struct Cloning {
    store: Option<PathBuf>,
    /// How long a change waits for the store's file lock ([`StoreLock::acquire_within`]).
    lock_wait: std::time::Duration,
    encoder: Result<Mutex<CodecEncoder>, String>,
    /// One creation or deletion at a time in this process (with the store's file lock across
    /// processes): the name check and the save are one step ([`Cloning::exclusive`]).
    lock: Arc<tokio::sync::Mutex<()>>,
    uploads: tokio::sync::Semaphore,
}

impl Cloning {
    /// Loads the encoder `cfg` names. `Err` only when the operator named it (`--encoder`) and it
    /// fails to load; the codec package's own failing leaves cloning off (501 says why).
    pub(super) fn open(cfg: &super::ServerConfig) -> Result<Self, String> {
        let encoder = match &cfg.encoder {
            None => Err(ENCODER_NEEDED.to_owned()),
            Some(path) => {
                let threads = crate::runtime::ThreadPlan::for_process(
                    crate::runtime::ThreadPolicy::default(),
                    None,
                    None,
                );
                let loaded = crate::runtime::environment(None)
                    .map_err(|e| e.to_string())
                    .and_then(|env| {
                        CodecEncoder::load(env, path, &threads).map_err(|e| e.to_string())
                    })
                    .map_err(|e| format!("the encoder {}: {e}", path.display()));
                match loaded {
                    Ok(enc) => Ok(Mutex::new(enc)),
                    Err(e) if cfg.encoder_required => return Err(e),
                    Err(e) => {
                        tracing::warn!("{e}; cloning over HTTP is off");
                        Err(e)
                    }
                }
            }
        };
        Ok(Self {
            store: cfg.voice_store.clone(),
            lock_wait: cfg.voice_lock_wait,
            encoder,
            lock: Arc::default(),
            uploads: tokio::sync::Semaphore::new(UPLOADS_AT_ONCE),
        })
    }

    /// A router without a working encoder still serves; cloning then answers 501.
    pub(super) fn open_or_explain(cfg: &super::ServerConfig) -> Self {
        Self::open(cfg).unwrap_or_else(|e| {
            tracing::error!("{e}; cloning over HTTP is off");
            Self {
                store: cfg.voice_store.clone(),
                lock_wait: cfg.voice_lock_wait,
                encoder: Err(e),
                lock: Arc::default(),
                uploads: tokio::sync::Semaphore::new(UPLOADS_AT_ONCE),
            }
        })
    }

    /// Whether voices can be cloned here, and if not why (for `GET /v1/audio/voices`).
    pub(super) fn status(&self) -> Value {
        match (self.store.as_ref(), self.encoder.as_ref()) {
            (Some(_), Ok(_)) => json!({"available": true}),
            (None, _) => json!({"available": false, "message": NO_STORE}),
            (_, Err(e)) => json!({"available": false, "message": e}),
        }
    }

    fn store(&self) -> Result<&Path, ApiError> {
        self.store
            .as_deref()
            .ok_or_else(|| ApiError::not_configured("voice_store_not_configured", NO_STORE))
    }

    /// Runs `f` on a blocking thread holding the one-change-at-a-time lock of this process and
    /// the store's file lock ([`StoreLock`]), which every server sharing the store takes: `f`
    /// sees every change any of them made before, and none is made while it runs. The work
    /// itself holds both, so a client that leaves mid-way cannot let the next change in early.
    /// Both are waited for `lock_wait` in all (changes queued in this process behind a stuck
    /// writer each give up after it too), then 503 `voice_store_busy`.
    async fn exclusive<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, ApiError> {
        let (store, wait) = (self.store()?.to_path_buf(), self.lock_wait);
        let busy = {
            let path = store.join(crate::voice::LOCK_FILE);
            move || {
                let e = VoiceError::StoreBusy {
                    path: path.clone(),
                    waited: wait,
                };
                ApiError::store_busy(e.to_string())
            }
        };
        let began = tokio::time::Instant::now();
        let one = match began.checked_add(wait) {
            Some(deadline) => tokio::time::timeout_at(deadline, self.lock.clone().lock_owned())
                .await
                .map_err(|_| busy())?,
            None => self.lock.clone().lock_owned().await,
        };
        blocking(move || {
            let _one = one;
            let left = wait.saturating_sub(began.elapsed());
            let _all = StoreLock::acquire_within(&store, left).map_err(|e| match e {
                VoiceError::StoreBusy { .. } => busy(),
                e => ApiError::internal(e.to_string()),
            })?;
            Ok(f())
        })
        .await?
    }

    fn consents(&self) -> Result<ConsentStore, ApiError> {
        Ok(ConsentStore::new(self.store()?.join("consents")))
    }
}

const NO_STORE: &str = "this server keeps no voices: start it with --voice-store DIR \
(onebit-tts serve does by default, in voices/custom/)";

/// One uploaded file.
struct Upload {
    bytes: Bytes,
    file_name: Option<String>,
}

impl Upload {
    /// The file name's extension, a hint for the audio probe.
    fn extension(&self) -> Option<&str> {
        self.file_name
            .as_deref()
            .and_then(|n| Path::new(n).extension())
            .and_then(|e| e.to_str())
    }
}

/// A form's text fields and files.
#[derive(Default)]
struct Form {
    fields: HashMap<String, String>,
    files: HashMap<String, Upload>,
}

impl Form {
    fn text(&self, name: &'static str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }

    fn required(&self, name: &'static str, why: &str) -> Result<&str, ApiError> {
        self.text(name)
            .ok_or_else(|| ApiError::missing_field(name, why))
    }

    fn file(&self, name: &'static str) -> Result<&Upload, ApiError> {
        self.files
            .get(name)
            .ok_or_else(|| ApiError::missing_field(name, " (an audio file)"))
    }
}

/// Uploads are not JSON, so a page on another site could post one without a CORS preflight: a
/// browser's `Origin` must be this server's own (or one `--cors-origin` allows).
fn check_origin(st: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let origin = origin.to_str().unwrap_or("");
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    let own = ["http://", "https://"]
        .iter()
        .any(|s| origin.strip_prefix(s) == Some(host));
    let allowed = st
        .cfg
        .cors_origins
        .iter()
        .any(|o| o == "*" || o.trim_end_matches('/') == origin);
    if own || allowed {
        Ok(())
    } else {
        Err(ApiError::forbidden(
            "cross_origin_upload",
            format!("uploads from a page at {origin:?} are refused; allow it with --cors-origin"),
        ))
    }
}

/// Reads a `multipart/form-data` body (or, with `json_ok`, a JSON object of text fields), then
/// checks where it came from.
/// `file` names the form's audio field: a body over the limit is that file being too large.
async fn read_form(
    st: &AppState,
    request: Request,
    json_ok: bool,
    file: &'static str,
) -> Result<Form, ApiError> {
    let (parts, body) = request.into_parts();
    let ct = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let limit = st.cfg.max_upload_bytes + FORM_OVERHEAD;
    let bytes = tokio::time::timeout(
        st.cfg.body_timeout,
        read_limited(limit, (2 * limit) as u64, &parts.headers, body),
    )
    .await
    .unwrap_or_else(|_| Err(ApiError::body_timeout(st.cfg.body_timeout)))
    .map_err(|e| {
        if e.status == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::file_too_large(file, None, st.cfg.max_upload_bytes)
        } else {
            e
        }
    })?;
    // Refusals come after the body is read: answering while the client still sends would cut
    // it off with a reset instead of the answer.
    check_origin(st, &parts.headers)?;
    if json_ok && super::schema::check_content_type(&parts.headers).is_ok() {
        let value: serde_json::Map<String, Value> =
            serde_json::from_slice(&bytes).map_err(ApiError::invalid_json)?;
        let mut form = Form::default();
        for (k, v) in value {
            let text = match v {
                Value::String(s) => s,
                other => other.to_string(),
            };
            form.fields.insert(k, text);
        }
        return Ok(form);
    }
    let boundary = multer::parse_boundary(&ct).map_err(|_| {
        ApiError::unsupported_media_type_of(
            &ct,
            if json_ok {
                "multipart/form-data or application/json"
            } else {
                "multipart/form-data"
            },
        )
    })?;
    let stream = futures_util::stream::once(async move { Ok::<_, std::io::Error>(bytes) });
    let mut multipart = multer::Multipart::new(stream, boundary);
    let mut form = Form::default();
    let bad = |e: multer::Error| {
        ApiError::bad_field(
            "body",
            "invalid_form",
            format!("the form is malformed: {e}"),
        )
    };
    while let Some(field) = multipart.next_field().await.map_err(bad)? {
        let name = field.name().unwrap_or("").to_owned();
        match field.file_name().map(str::to_owned) {
            Some(file_name) => {
                let bytes = field.bytes().await.map_err(bad)?;
                form.files.insert(
                    name,
                    Upload {
                        bytes,
                        file_name: Some(file_name),
                    },
                );
            }
            None => {
                let text = field.text().await.map_err(bad)?;
                form.fields.insert(name, text);
            }
        }
    }
    Ok(form)
}

/// The uploaded audio decoded, within the size limit and `max_seconds`; `param` names the field
/// in errors.
async fn decode_upload(
    st: &AppState,
    upload: &Upload,
    param: &'static str,
    max_seconds: u32,
) -> Result<DecodedAudio, ApiError> {
    if upload.bytes.len() > st.cfg.max_upload_bytes {
        return Err(ApiError::file_too_large(
            param,
            Some(upload.bytes.len()),
            st.cfg.max_upload_bytes,
        ));
    }
    let bytes = upload.bytes.clone();
    let ext = upload.extension().map(str::to_owned);
    tokio::task::spawn_blocking(move || decode_bytes_within(&bytes, ext.as_deref(), max_seconds))
        .await
        .map_err(|e| ApiError::internal(format!("decoding stopped: {e}")))?
        .map_err(|e| match e {
            AudioError::InputTooLong { max_seconds } => ApiError::bad_field(
                param,
                "audio_too_long",
                format!("{param} is longer than {max_seconds} s"),
            ),
            e => ApiError::bad_field(param, "invalid_audio", format!("{param}: {e}")),
        })
}

/// The language of a consent or a voice, as the front end names it.
fn language(tag: &str, param: &'static str) -> Result<Language, ApiError> {
    if !crate::voice::consent::valid_tag(tag) {
        return Err(ApiError::invalid_value(
            param,
            format!("{param} must be a BCP 47 tag such as en-US (1-35 letters, digits and '-')"),
        ));
    }
    Language::from_bcp47(tag).map_err(|e| ApiError::invalid_value(param, e.to_string()))
}

fn consent_object(c: &Consent) -> Value {
    json!({"id": c.id, "object": "audio.voice_consent", "name": c.name,
           "language": c.language, "created_at": c.created_at,
           "recording_seconds": c.seconds})
}

impl From<ConsentError> for ApiError {
    fn from(e: ConsentError) -> Self {
        let msg = e.to_string();
        match e {
            ConsentError::NotFound(_) => ApiError::no_object("consent_not_found", msg),
            ConsentError::BadName => ApiError::invalid_value("name", msg),
            ConsentError::Io { .. } | ConsentError::Invalid { .. } => ApiError::internal(msg),
        }
    }
}

/// `POST /v1/audio/voice_consents`: `name`, `language`, `recording`.
pub(super) async fn create_consent(State(st): State<Arc<AppState>>, request: Request) -> Response {
    reply(async {
        let upload = st.cloning.uploads.acquire().await;
        let form = read_form(&st, request, false, "recording").await?;
        let consents = st.cloning.consents()?;
        let name = form
            .required("name", " (a label for the consent)")?
            .to_owned();
        let tag = form
            .required("language", " (the BCP 47 tag of the consent phrase)")?
            .to_owned();
        language(&tag, "language")?;
        let recording = form.file("recording")?;
        let audio = decode_upload(&st, recording, "recording", MAX_CONSENT_SECONDS).await?;
        if audio.samples.is_empty() {
            return Err(ApiError::bad_field(
                "recording",
                "invalid_audio",
                "recording holds no audio",
            ));
        }
        let bytes = recording.bytes.clone();
        let ext = recording.extension().map(str::to_owned);
        // The upload place bounds reading and decoding, not the store's lock: held through the
        // lock's wait, uploads queued behind a stuck writer would wait one wait after another.
        drop(upload);
        let c = st
            .cloning
            .exclusive(move || {
                consents.create(&name, &tag, &bytes, ext.as_deref(), audio.duration_secs)
            })
            .await??;
        tracing::info!(id = %c.id, name = %c.name, "consent recording kept");
        Ok(axum::Json(consent_object(&c)).into_response())
    })
    .await
}

/// `GET /v1/audio/voice_consents?after=ID&limit=N`: OpenAI's cursor page, oldest first.
pub(super) async fn list_consents(
    State(st): State<Arc<AppState>>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    reply(async {
        let limit = match q.get("limit") {
            None => 20,
            Some(l) => l
                .parse::<usize>()
                .ok()
                .filter(|l| (1..=100).contains(l))
                .ok_or_else(|| {
                    ApiError::invalid_value("limit", format!("limit must be 1..=100, got {l:?}"))
                })?,
        };
        let consents = st.cloning.consents()?;
        let all = blocking(move || consents.list()).await??;
        let start = match q.get("after") {
            None => 0,
            Some(after) => {
                all.iter().position(|c| &c.id == after).ok_or_else(|| {
                    ApiError::invalid_value("after", format!("no consent {after:?} to list after"))
                })? + 1
            }
        };
        let page: Vec<&Consent> = all.iter().skip(start).take(limit).collect();
        let has_more = start + page.len() < all.len();
        Ok(axum::Json(json!({
            "object": "list",
            "data": page.iter().map(|c| consent_object(c)).collect::<Vec<_>>(),
            "first_id": page.first().map(|c| &c.id),
            "last_id": page.last().map(|c| &c.id),
            "has_more": has_more,
        }))
        .into_response())
    })
    .await
}

/// `GET /v1/audio/voice_consents/{id}`.
pub(super) async fn get_consent(
    State(st): State<Arc<AppState>>,
    UrlPath(id): UrlPath<String>,
) -> Response {
    reply(async {
        let consents = st.cloning.consents()?;
        let c = blocking(move || consents.get(&id)).await??;
        Ok(axum::Json(consent_object(&c)).into_response())
    })
    .await
}

/// `POST /v1/audio/voice_consents/{id}` with `name`: a new label.
pub(super) async fn update_consent(
    State(st): State<Arc<AppState>>,
    UrlPath(id): UrlPath<String>,
    request: Request,
) -> Response {
    reply(async {
        let form = read_form(&st, request, true, "name").await?;
        let consents = st.cloning.consents()?;
        let name = form.required("name", " (the new label)")?.to_owned();
        let c = st
            .cloning
            .exclusive(move || consents.rename(&id, &name))
            .await??;
        Ok(axum::Json(consent_object(&c)).into_response())
    })
    .await
}

/// `DELETE /v1/audio/voice_consents/{id}`.
pub(super) async fn delete_consent(
    State(st): State<Arc<AppState>>,
    UrlPath(id): UrlPath<String>,
) -> Response {
    reply(async {
        let consents = st.cloning.consents()?;
        let c = st.cloning.exclusive(move || consents.delete(&id)).await??;
        Ok(
            axum::Json(json!({"id": c.id, "object": "audio.voice_consent", "deleted": true}))
                .into_response(),
        )
    })
    .await
}

/// OpenAI's `audio.voice`, with what a NeuTTS voice has besides (language, transcript, length).
pub(super) fn voice_object(v: &Voice) -> Value {
    let (id, created_at) = v
        .custom
        .as_ref()
        .map_or((v.name.as_str(), 0), |c| (c.id.as_str(), c.created_at));
    json!({"id": id, "object": "audio.voice", "name": v.name, "type": "audio_sample",
           "created_at": created_at, "language": v.language, "transcript": v.transcript,
           "reference_seconds": v.seconds(),
           "consent": v.custom.as_ref().map(|c| &c.consent)})
}

fn clone_error(e: CloneError) -> ApiError {
    let msg = e.to_string();
    match e {
        CloneError::Voice(VoiceError::BadName(_)) => ApiError::invalid_value("name", msg),
        CloneError::EmptyTranscript => ApiError::bad_field("transcript", "empty_transcript", msg),
        CloneError::Language { .. } => ApiError::invalid_value("language", msg),
        CloneError::NoCodes => ApiError::bad_field("audio_sample", "audio_too_short", msg),
        CloneError::NoEncoder { .. } => ApiError::not_configured("encoder_not_configured", msg),
        CloneError::Voice(_) | CloneError::SampleRate { .. } | CloneError::Codec(_) => {
            ApiError::internal(msg)
        }
    }
}

/// `POST /v1/audio/voices`: `name`, `audio_sample`, `consent`, `transcript` (ours: the exact
/// words of the sample), optional `language` (else the consent's) and `type` (`audio_sample`).
pub(super) async fn create_voice(State(st): State<Arc<AppState>>, request: Request) -> Response {
    reply(async {
        let upload = st.cloning.uploads.acquire().await;
        let form = read_form(&st, request, false, "audio_sample").await?;
        let store = st.cloning.store()?.to_path_buf();
        if let Err(e) = &st.cloning.encoder {
            return Err(ApiError::not_configured("encoder_not_configured", e.clone()));
        }
        if let Some(t) = form.text("type").filter(|t| *t != "audio_sample") {
            return Err(ApiError::invalid_value(
                "type",
                format!("type {t:?} is not supported: NeuTTS clones voices from an audio_sample"),
            ));
        }
        let name = form.required("name", " (the new voice's name)")?.to_owned();
        let consent_id = form
            .required("consent", " (a consent recording id, cons_...)")?
            .to_owned();
        let transcript = form
            .required(
                "transcript",
                ": NeuTTS needs the exact words spoken in audio_sample (this server's extension \
                 to OpenAI's form)",
            )?
            .to_owned();
        let mut spec = CloneSpec {
            name: name.clone(),
            transcript,
            language: String::new(),
            license: String::new(),
            source: String::new(),
        };
        check_new_name(&st, &name)?;
        if let Err(crate::synth::SynthError::InputTooLong { got, limit }) =
            st.door.limits().check_text(&spec.transcript)
        {
            return Err(ApiError::bad_field(
                "transcript",
                "transcript_too_long",
                format!("transcript has {got} characters; the limit is {limit} (max_input_chars)"),
            ));
        }
        let consents = st.cloning.consents()?;
        let consent = blocking(move || consents.get(&consent_id))
            .await?
            .map_err(|e| match e {
                ConsentError::NotFound(_) => {
                    ApiError::bad_field("consent", "consent_not_found", e.to_string())
                }
                other => other.into(),
            })?;
        let tag = form.text("language").unwrap_or(&consent.language).to_owned();
        let param = if form.text("language").is_some() {
            "language"
        } else {
            "consent"
        };
        spec.language = language(&tag, param)?.as_str().to_owned();
        spec.check().map_err(clone_error)?;

        let sample = form.file("audio_sample")?;
        let audio = decode_upload(&st, sample, "audio_sample", MAX_SAMPLE_SECONDS as u32 + 1).await?;
        if audio.duration_secs < MIN_SAMPLE_SECONDS {
            return Err(ApiError::bad_field(
                "audio_sample",
                "audio_too_short",
                format!(
                    "audio_sample is {:.2} s; a voice needs at least {MIN_SAMPLE_SECONDS} s (3-15 s is best)",
                    audio.duration_secs
                ),
            ));
        }
        if audio.duration_secs > MAX_SAMPLE_SECONDS {
            return Err(ApiError::bad_field(
                "audio_sample",
                "audio_too_long",
                format!(
                    "audio_sample is {:.1} s; the limit is {MAX_SAMPLE_SECONDS} s (3-15 s is best)",
                    audio.duration_secs
                ),
            ));
        }
        spec.source = format!(
            "cloned over HTTP from {} ({:.2} s) under consent {}",
            sample.file_name.as_deref().unwrap_or("an upload"),
            audio.duration_secs,
            consent.id
        );
        // Encoding takes the encoder's lock on a blocking thread: one clone encodes at a time.
        let st2 = st.clone();
        let consent_id = consent.id.clone();
        let (voice, warnings) = blocking(move || -> Result<(Voice, Vec<String>), ApiError> {
            let Ok(encoder) = st2.cloning.encoder.as_ref() else {
                return Err(ApiError::internal("the encoder went away"));
            };
            let mut enc = encoder
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let cloned = clone_voice(&spec, &audio, &mut enc).map_err(clone_error)?;
            drop(enc);
            let mut voice = cloned.voice;
            voice.custom = Some(CustomVoice {
                id: crate::voice::new_id(crate::voice::CUSTOM_ID_PREFIX.trim_end_matches('_')),
                created_at: crate::voice::unix_now(),
                consent: consent_id,
            });
            let mut warnings = cloned.warnings;
            match st2.synth.front_end().check_reference(&voice) {
                Ok(w) => warnings.extend(w),
                Err(SynthError::Voice(e @ VoiceError::TooLong { .. })) => {
                    return Err(ApiError::bad_field(
                        "audio_sample",
                        "audio_too_long",
                        e.to_string(),
                    ));
                }
                Err(e) => return Err(ApiError::from(e)),
            }
            Ok((voice, warnings))
        })
        .await??;
        let st2 = st.clone();
        // Encoded: the store's lock is waited for without the upload place (see create_consent).
        drop(upload);
        let (voice, warnings) = st
            .cloning
            .exclusive(move || -> Result<(Voice, Vec<String>), ApiError> {
                // Checked again under the locks: a voice of this name may have been made
                // meanwhile, here or by another server sharing the store (which is read again).
                check_new_name(&st2, &voice.name)?;
                st2.synth
                    .install_voice(&voice, &store)
                    .map_err(|e| match e {
                        VoiceError::Exists(_) => ApiError::name_taken(format!(
                            "a voice named {:?} exists; pick another name",
                            voice.name
                        )),
                        other => ApiError::internal(other.to_string()),
                    })?;
                Ok((voice, warnings))
            })
            .await??;
        tracing::info!(name = %voice.name, codes = voice.codes.len(), "voice cloned");
        let mut obj = voice_object(&voice);
        obj["warnings"] = json!(warnings);
        Ok(axum::Json(obj).into_response())
    })
    .await
}

/// A new voice's name: valid, not any voice's, not an alias (which would hide it, and which
/// `serve` refuses at the next start), not spelled like an id.
fn check_new_name(st: &AppState, name: &str) -> Result<(), ApiError> {
    crate::voice::validate_name(name)
        .map_err(|e| ApiError::invalid_value("name", e.to_string()))?;
    if name.starts_with(crate::voice::CUSTOM_ID_PREFIX) {
        return Err(ApiError::invalid_value(
            "name",
            format!(
                "names beginning {:?} are kept for ids",
                crate::voice::CUSTOM_ID_PREFIX
            ),
        ));
    }
    if st.synth.voices().path_of(name).is_some() {
        return Err(ApiError::name_taken(format!(
            "a voice named {name:?} exists; pick another name"
        )));
    }
    let alias = st
        .aliases
        .iter()
        .find(|(a, _)| *a == name)
        .map(|(_, to)| to.to_owned());
    let default = super::names::DEFAULT_ALIASES
        .iter()
        .any(|(a, _)| *a == name);
    if alias.is_some() || default {
        return Err(ApiError::name_taken(format!(
            "{name:?} is an alias{}; pick another name",
            alias
                .map(|v| format!(" of voice {v:?}"))
                .unwrap_or_default()
        )));
    }
    Ok(())
}

/// `GET /v1/audio/voices/{id}`: a voice by id (`voice_...`) or name.
pub(super) async fn get_voice(
    State(st): State<Arc<AppState>>,
    UrlPath(id): UrlPath<String>,
) -> Response {
    reply(async {
        let voices = st.synth.voices();
        let v = voices
            .get(&id)
            .map_err(|e| ApiError::no_object("voice_not_found", e.to_string()))?;
        Ok(axum::Json(voice_object(v)).into_response())
    })
    .await
}

/// `DELETE /v1/audio/voices/{id}`: only voices in the voice store (created here) go.
pub(super) async fn delete_voice(
    State(st): State<Arc<AppState>>,
    UrlPath(id): UrlPath<String>,
) -> Response {
    reply(async {
        let store = st.cloning.store()?.to_path_buf();
        // An alias that names the voice would name nothing after a restart, and `serve` refuses
        // such aliases: the voice stays while one points at it.
        if let Ok(v) = st.synth.voices().get(&id)
            && let Some((alias, _)) = st.aliases.iter().find(|(_, to)| *to == v.name)
        {
            return Err(ApiError::conflict(
                "voice_aliased",
                format!(
                    "the alias {alias:?} names voice {:?}; change the aliases first",
                    v.name
                ),
            ));
        }
        let st2 = st.clone();
        let voice = st
            .cloning
            .exclusive(move || st2.synth.uninstall_voice(&id, &store))
            .await?
            .map_err(|e| match e {
                VoiceError::Unknown { .. } => ApiError::no_object("voice_not_found", e.to_string()),
                VoiceError::NotRemovable { name, .. } => ApiError::forbidden(
                    "voice_not_removable",
                    format!(
                        "voice {name:?} was not created over HTTP; only those are deleted here"
                    ),
                ),
                other => ApiError::internal(other.to_string()),
            })?;
        let id = voice
            .custom
            .as_ref()
            .map_or(voice.name.clone(), |c| c.id.clone());
        tracing::info!(name = %voice.name, "voice deleted");
        Ok(
            axum::Json(json!({"id": id, "object": "audio.voice.deleted", "deleted": true}))
                .into_response(),
        )
    })
    .await
}

/// Runs file work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("the task stopped: {e}")))
}

async fn reply(f: impl std::future::Future<Output = Result<Response, ApiError>>) -> Response {
    f.await.unwrap_or_else(IntoResponse::into_response)
}
