//! Hugging Face Hub access (hf-hub sync API): the standard cache (`HF_HOME`), `HF_TOKEN`,
//! `HF_ENDPOINT`, `HF_HUB_OFFLINE`, and a progress bar while downloading.

use std::collections::BTreeSet;
use std::path::PathBuf;

use hf_hub::api::sync::{Api, ApiBuilder, ApiError};
use hf_hub::api::Progress;
use hf_hub::{Cache, Repo, RepoType};

use crate::{LoaderError, Result};

/// Where and how to reach the Hub.
#[derive(Clone, Debug)]
pub struct HubSettings {
    /// The `hub` folder of the HF cache (`$HF_HOME/hub`, default `~/.cache/huggingface/hub`).
    pub cache_dir: PathBuf,
    pub endpoint: String,
    pub token: Option<String>,
    /// Use only the cache, never the network.
    pub offline: bool,
    /// Draw a progress bar on stderr while downloading.
    pub progress: bool,
}

impl HubSettings {
    /// Reads `HF_HOME`, `HF_ENDPOINT`, `HF_TOKEN` (or the cached token file) and `HF_HUB_OFFLINE`.
    pub fn from_env() -> Self {
        let cache = Cache::from_env();
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let offline = env("HF_HUB_OFFLINE").is_some_and(|v| {
            matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on")
        });
        Self {
            token: env("HF_TOKEN").or_else(|| cache.token()),
            cache_dir: cache.path().clone(),
            endpoint: env("HF_ENDPOINT").unwrap_or_else(|| "https://huggingface.co".into()),
            offline,
            progress: true,
        }
    }
}

/// One model repo on the Hub.
pub struct HubRepo<'a> {
    id: String,
    settings: &'a HubSettings,
}

fn local_folder_hint(id: &str) -> String {
    format!(
        "to run without the network, download the repo elsewhere (e.g. `huggingface-cli download {id} --local-dir DIR`) and \
         pass the folder path instead of the repo id, or set HF_HUB_OFFLINE=1 to use a cached copy"
    )
}

/// What went wrong talking to the Hub, as far as the advice to the user depends on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HubFailure {
    /// No answer: connection, DNS, TLS or timeout.
    Unreachable,
    /// HTTP 404: no such repo, or no such file in it.
    NotFound,
    /// HTTP 401/403: a private or gated repo without a token that may read it.
    Unauthorized,
    /// Anything else (another status, a local cache or I/O error).
    Other,
}

fn classify(error: &ApiError) -> HubFailure {
    match error {
        ApiError::RequestError(e) => match e.as_ref() {
            ureq::Error::Status(404, _) => HubFailure::NotFound,
            ureq::Error::Status(401 | 403, _) => HubFailure::Unauthorized,
            ureq::Error::Status(..) => HubFailure::Other,
            ureq::Error::Transport(_) => HubFailure::Unreachable,
        },
        ApiError::TooManyRetries(inner) => classify(inner),
        _ => HubFailure::Other,
    }
}

impl<'a> HubRepo<'a> {
    pub fn new(id: &str, settings: &'a HubSettings) -> Self {
        Self {
            id: id.to_string(),
            settings,
        }
    }

    fn api(&self) -> Result<Api> {
        ApiBuilder::from_cache(Cache::new(self.settings.cache_dir.clone()))
            .with_endpoint(self.settings.endpoint.clone())
            .with_token(self.settings.token.clone())
            .with_progress(false)
            .build()
            .map_err(|e| self.download_error("<api>", &e))
    }

    /// The error of a failed Hub request, with advice that fits the failure: "no network?"
    /// only when the Hub did not answer, a missing repo or file for 404, HF_TOKEN for 401/403.
    fn download_error(&self, file: &str, error: &ApiError) -> LoaderError {
        let endpoint = &self.settings.endpoint;
        let advice = match classify(error) {
            HubFailure::Unreachable => format!(
                "Could not reach {endpoint} (no network?). {}",
                local_folder_hint(&self.id)
            ),
            HubFailure::NotFound => format!(
                "{endpoint} has no repo `{}` or no file `{file}` in it: check the repo id (e.g. kyutai/moshiko-mlx-q4) \
                 and the file name, or pass the path of a local folder",
                self.id
            ),
            HubFailure::Unauthorized => format!(
                "{endpoint} refused access to `{}`: for a private or gated repo set HF_TOKEN to a token that may read it \
                 (and accept the repo's terms on the Hub)",
                self.id
            ),
            HubFailure::Other => local_folder_hint(&self.id),
        };
        LoaderError::Download {
            repo: self.id.clone(),
            file: file.to_string(),
            reason: format!("{error}. {advice}"),
        }
    }

    /// The cached snapshot folder of the repo's `main` revision (offline use).
    pub fn cached_snapshot(&self) -> Result<PathBuf> {
        let repo = Repo::new(self.id.clone(), RepoType::Model);
        let base = self.settings.cache_dir.join(repo.folder_name());
        let not_cached = |why: String| {
            LoaderError::NotFound {
            what: self.id.clone(),
            reason: format!(
                "HF_HUB_OFFLINE is set and the repo is not in the Hugging Face cache at {} ({why}); download it while \
                 online, or pass the path of a local folder holding its files instead of the repo id",
                self.settings.cache_dir.display()
            ),
        }
        };
        let ref_path = base.join("refs").join("main");
        let commit = std::fs::read_to_string(&ref_path)
            .map_err(|e| not_cached(format!("{}: {e}", ref_path.display())))?;
        let snapshot = base.join("snapshots").join(commit.trim());
        if !snapshot.is_dir() {
            return Err(not_cached(format!("{} is missing", snapshot.display())));
        }
        Ok(snapshot)
    }

    /// The repo's file names (one request).
    pub fn list_files(&self) -> Result<BTreeSet<String>> {
        let info = self
            .api()?
            .model(self.id.clone())
            .info()
            .map_err(|e| self.download_error("<file list>", &e))?;
        Ok(info.siblings.into_iter().map(|s| s.rfilename).collect())
    }

    /// The local path of `file`, downloaded into the cache unless already there.
    pub fn download(&self, file: &str) -> Result<PathBuf> {
        let cache = Cache::new(self.settings.cache_dir.clone());
        if let Some(path) = cache.model(self.id.clone()).get(file) {
            return Ok(path);
        }
        let repo = self.api()?.model(self.id.clone());
        let result = if self.settings.progress {
            repo.download_with_progress(file, ProgressBar::default())
        } else {
            repo.download_with_progress(file, ())
        };
        result.map_err(|e| self.download_error(file, &e))
    }
}

/// An indicatif bar fed by hf-hub.
#[derive(Default)]
struct ProgressBar(Option<indicatif::ProgressBar>);

impl Progress for ProgressBar {
    fn init(&mut self, size: usize, filename: &str) {
        let bar = indicatif::ProgressBar::new(size as u64);
        let style = indicatif::ProgressStyle::with_template(
            "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
        bar.set_style(style.progress_chars("=> "));
        bar.set_message(filename.to_string());
        self.0 = Some(bar);
    }

    fn update(&mut self, size: usize) {
        if let Some(bar) = &self.0 {
            bar.inc(size as u64);
        }
    }

    fn finish(&mut self) {
        if let Some(bar) = self.0.take() {
            bar.finish();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> HubSettings {
        HubSettings {
            cache_dir: std::env::temp_dir(),
            endpoint: "http://127.0.0.1:1".into(),
            token: None,
            offline: false,
            progress: false,
        }
    }

    fn status(code: u16) -> ApiError {
        let response = ureq::Response::new(code, "status", "").unwrap();
        ApiError::RequestError(Box::new(ureq::Error::Status(code, response)))
    }

    /// Only a Hub that does not answer is "no network?"; 404 says the repo or file was not
    /// found, 401/403 point at HF_TOKEN.
    #[test]
    fn hub_failures_get_advice_that_fits_them() {
        let settings = settings();
        let repo = HubRepo::new("kyutai/nope", &settings);
        let message = |e: &ApiError| repo.download_error("model.safetensors", e).to_string();

        // Port 1 on the loopback: refused at once, no network involved.
        let refused = ureq::get("http://127.0.0.1:1/").call().unwrap_err();
        assert!(matches!(refused, ureq::Error::Transport(_)), "{refused}");
        let m = message(&ApiError::RequestError(Box::new(refused)));
        assert!(m.contains("no network?"), "{m}");

        let m = message(&status(404));
        assert!(
            m.contains("no repo `kyutai/nope` or no file `model.safetensors`")
                && !m.contains("no network"),
            "{m}"
        );
        for code in [401, 403] {
            let m = message(&status(code));
            assert!(m.contains("HF_TOKEN") && !m.contains("no network"), "{m}");
        }
        let m = message(&ApiError::TooManyRetries(Box::new(status(404))));
        assert!(m.contains("no repo") && !m.contains("no network"), "{m}");
        let m = message(&status(500));
        assert!(m.contains("500") && !m.contains("no network"), "{m}");
    }
}
