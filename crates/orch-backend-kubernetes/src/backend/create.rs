//! Submitting a cell: the run's Secret (once, from the host's values) and
//! its ConfigMaps of files (each once, by digest), the cell's Job and a
//! multi-node cell's headless Service, each made again over one of the same
//! name left by an earlier invocation.

use super::api::{call, CallError};
use super::KubernetesBackend;
use crate::{files, spec, KubeError};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use kube::api::{Api, DeleteParams, PostParams};
use std::time::{Duration, Instant};

impl KubernetesBackend {
    /// The run's Secret, made once from the values the host holds.
    pub(super) async fn ensure_secret(
        &self,
        run_id: &str,
        values: &[(String, String)],
    ) -> Result<(), KubeError> {
        if values.is_empty() || self.settings.secret_name.is_some() {
            return Ok(());
        }
        let mut made = self.secrets_made.lock().await;
        if made.iter().any(|r| r == run_id) {
            return Ok(());
        }
        let secrets: Api<Secret> = self.api();
        let secret = spec::run_secret(run_id, values, &self.settings);
        let name = spec::secret_name(run_id);
        let budget = self.api_budget;
        let create = || {
            call(budget, || async {
                secrets.create(&PostParams::default(), &secret).await
            })
        };
        match create().await {
            Ok(_) => {}
            Err(CallError::Api(kube::Error::Api(s))) if s.code == 409 => {
                // Left by an earlier invocation of this run (or made by
                // this call before its answer was lost): made again from
                // this host's values.
                match call(budget, || async {
                    secrets.delete(&name, &DeleteParams::default()).await
                })
                .await
                {
                    Ok(_) | Err(CallError::Api(kube::Error::Api(_))) => {}
                    Err(e) => return Err(e.into_kube(&format!("delete secret {name}"), budget)),
                }
                create()
                    .await
                    .map_err(|e| e.into_kube(&format!("create secret {name}"), budget))?;
            }
            Err(e) => return Err(e.into_kube(&format!("create secret {name}"), budget)),
        }
        made.push(run_id.to_string());
        Ok(())
    }

    /// The ConfigMaps of a cell's files, each created once per run (one
    /// already there has the same content: its name is its keys' digest).
    /// Returns how many were new and their bytes.
    pub(super) async fn ensure_files(
        &self,
        run_id: &str,
        packs: &[files::Pack],
    ) -> Result<(usize, u64), KubeError> {
        let api: Api<ConfigMap> = self.api();
        let mut new = (0, 0);
        for pack in packs {
            let key = (run_id.to_string(), pack.name.clone());
            if self.files_made.lock().await.contains(&key) {
                continue;
            }
            let cm = files::config_map(pack, run_id, &self.settings)?;
            match call(self.api_budget, || async {
                api.create(&PostParams::default(), &cm).await
            })
            .await
            {
                Ok(_) => {
                    new.0 += 1;
                    new.1 += pack.bytes();
                }
                // Made by another cell of the run, or an earlier invocation of it.
                Err(CallError::Api(kube::Error::Api(s))) if s.code == 409 => {}
                Err(e) => {
                    return Err(e.into_kube(&format!("create configmap {}", pack.name), self.api_budget))
                }
            }
            self.files_made.lock().await.insert(key);
        }
        Ok(new)
    }

    /// Create the Job and return its uid. One of the same name left by an
    /// earlier invocation of the run is deleted first, with its pods
    /// (foreground), so that its pod is never taken for the new one's.
    pub(super) async fn create_job(&self, job: &Job) -> Result<String, KubeError> {
        let made = self.create_fresh(job, "job", DeleteParams::foreground()).await?;
        Ok(made.metadata.uid.unwrap_or_default())
    }

    /// Create `obj`, again and again while the API server is away (for the
    /// API budget), in the rate limit's creators' turn
    /// ([`crate::limiter::Limiter::turn`]). A create whose answer was lost, or an object of the same
    /// name left by an earlier invocation, is found as a 409: that one is
    /// deleted (`dp`), its going waited for (at most 120 s), and the create
    /// made again.
    async fn create_fresh<K>(&self, obj: &K, what: &str, dp: DeleteParams) -> Result<K, KubeError>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + std::fmt::Debug
            + serde::Serialize
            + serde::de::DeserializeOwned,
        <K as kube::Resource>::DynamicType: Default,
    {
        let api: Api<K> = self.api();
        let name = obj.meta().name.clone().unwrap_or_default();
        let started = Instant::now();
        let budget = self.api_budget;
        let limiter = crate::limiter::shared();
        loop {
            let made = {
                let _turn = limiter.turn().await;
                call(budget, || async { api.create(&PostParams::default(), obj).await }).await
            };
            match made {
                Ok(made) => return Ok(made),
                Err(CallError::Api(kube::Error::Api(s)))
                    if s.code == 409 && started.elapsed() < Duration::from_secs(120) =>
                {
                    let _ = call(budget, || async { api.delete(&name, &dp).await }).await;
                    while started.elapsed() < Duration::from_secs(120) {
                        if let Ok(None) = call(budget, || api.get_opt(&name)).await {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
                Err(e) => return Err(e.into_kube(&format!("create {what} {name}"), budget)),
            }
        }
    }

    /// Create a multi-node cell's headless Service, owned by its Job. One
    /// of the same name left by an earlier invocation is deleted first.
    pub(super) async fn create_service(&self, svc: &Service) -> Result<(), KubeError> {
        self.create_fresh(svc, "service", DeleteParams::background())
            .await?;
        Ok(())
    }
}
