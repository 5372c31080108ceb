//! `serve`: the OpenAI-compatible HTTP API. Its options (`server::ServeArgs`) and their checks
//! live in the library's server module.

use anyhow::{Context, Result};

use onebit_tts::server::ServeArgs;
use onebit_tts::synth::Synthesizer;

use crate::args::{ModelArgs, synth_config};

pub fn serve(model: &ModelArgs, args: &ServeArgs) -> Result<()> {
    // Checked before the model loads (minutes, for a large one): keys, limits, exposure.
    let mut server_cfg = args.config(String::new())?;
    let mut cfg = synth_config(model);
    // Voices created over HTTP live in the store, which is read first so they load again after a
    // restart, and a shipped voice of the same name wins.
    let store = args
        .voice_store
        .clone()
        .unwrap_or_else(|| crate::voices::store_dir().join(onebit_tts::voice::CUSTOM_SUBDIR));
    cfg.voice_dirs.retain(|d| d != &store);
    cfg.voice_dirs.insert(0, store.clone());
    server_cfg.voice_store = Some(store);
    let synth = std::sync::Arc::new(Synthesizer::load(&cfg)?);
    if server_cfg.encoder.is_none() {
        server_cfg.encoder = synth.package().codec.encoder.clone();
    }
    tracing::info!(
        package = %synth.package().dir.display(),
        engine = %synth.engine_description(),
        device = %synth.device_label(),
        voices = synth.voices().names().len(),
        "model loaded"
    );
    server_cfg.device = synth.device_label();
    // The normaliser's grammars load now, not on the first request of each language; a missing
    // one is said here (requests in that language are then spoken as written).
    for lang in onebit_tts::text::Language::ALL {
        let t = std::time::Instant::now();
        match synth.front_end().normalizer().warm(lang) {
            Ok(()) => tracing::debug!("normaliser: {lang} ready in {:?}", t.elapsed()),
            Err(e) => tracing::warn!("{e}"),
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(onebit_tts::server::serve(synth, server_cfg))
        .context("server")?;
    // The runtime (and with it the last handle on the synthesizer) goes before main returns.
    drop(rt);
    tracing::info!("stopped");
    Ok(())
}
