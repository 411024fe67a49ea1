//! Deleting: a cell's Job with its pods (and a multi-node cell's
//! Service) when the cell ends, is cancelled or times out; a run's objects
//! by its label (`cleanup`, `orch down`). Each goes on while the API server
//! is away, for the API budget.

use super::api::{call, transient, unreachable_message, CallError};
use super::{JobCell, KubernetesBackend, API_TIMEOUT};
use crate::{spec, KubeError};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use kube::api::{Api, DeleteParams, ListParams};
use orch_backend::BackendError;
use std::time::{Duration, Instant};

impl KubernetesBackend {
    /// Delete a Job with its pods, again and again while the API server is
    /// away (for the API budget). `Err`: why it is still there.
    pub(super) async fn delete_job(&self, name: &str) -> Result<(), String> {
        self.delete_named::<Job>(name, "job").await
    }

    /// Delete the object `name` in the background (its dependents too),
    /// retried while the API server is away; gone already is fine.
    async fn delete_named<K>(&self, name: &str, what: &str) -> Result<(), String>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + std::fmt::Debug
            + serde::de::DeserializeOwned,
        <K as kube::Resource>::DynamicType: Default,
    {
        let api: Api<K> = self.api();
        match call(self.api_budget, || async {
            api.delete(name, &DeleteParams::background()).await
        })
        .await
        {
            Ok(_) => Ok(()),
            Err(CallError::Api(kube::Error::Api(s))) if s.code == 404 => Ok(()),
            Err(CallError::Api(e)) => Err(KubeError::api(format!("delete {what} {name}"))(e).to_string()),
            Err(CallError::Unreachable(last)) => Err(unreachable_message(self.api_budget, &last)),
        }
    }

    /// Delete a Service (the garbage collector also does, with its Job).
    pub(super) async fn delete_service(&self, name: &str) -> Result<(), String> {
        self.delete_named::<Service>(name, "service").await
    }

    /// Delete the Services of a run (`orch down`): `deletecollection` by
    /// label, or, where the API server does not offer it for Services (a
    /// 405), each one listed by label.
    async fn delete_services(&self, lp: &ListParams, budget: Duration) -> Result<(), CallError> {
        let api: Api<Service> = self.api();
        match call(budget, || async {
            api.delete_collection(&DeleteParams::background(), lp).await
        })
        .await
        {
            Ok(_) => Ok(()),
            Err(CallError::Api(kube::Error::Api(s))) if s.code == 405 => {
                let list = call(budget, || api.list(lp)).await?;
                for svc in list.items {
                    let name = svc.metadata.name.unwrap_or_default();
                    match call(budget, || async {
                        api.delete(&name, &DeleteParams::background()).await
                    })
                    .await
                    {
                        Ok(_) => {}
                        Err(CallError::Api(kube::Error::Api(s))) if s.code == 404 => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Delete every object of a run, by its label: the Secret first (it
    /// holds values), the ConfigMaps, Jobs, Services and pods; then wait
    /// for the pods to go.
    pub(super) async fn delete_run(&self, run_id: &str) -> Result<(), BackendError> {
        let lp = ListParams::default().labels(&spec::run_selector(run_id));
        let jobs: Api<Job> = self.api();
        let pods: Api<Pod> = self.api();
        let secrets: Api<Secret> = self.api();
        let config_maps: Api<ConfigMap> = self.api();
        // Every kind is tried (the Secret first: it holds values), each
        // again while the API server is away (the budget: one for all, so
        // an API server gone for good holds `orch` for one budget), the
        // first error is returned after.
        let budget = self.api_budget;
        let t0 = Instant::now();
        let left = || budget.saturating_sub(t0.elapsed()).max(Duration::from_secs(1));
        let s = call(left(), || async {
            secrets.delete_collection(&DeleteParams::default(), &lp).await
        })
        .await
        .map(|_| ());
        let f = call(left(), || async {
            config_maps.delete_collection(&DeleteParams::default(), &lp).await
        })
        .await
        .map(|_| ());
        let j = call(left(), || async {
            jobs.delete_collection(&DeleteParams::background(), &lp).await
        })
        .await
        .map(|_| ());
        // The headless Services of multi-node cells (their Jobs' garbage
        // collection takes them too; one whose Job is gone stays otherwise).
        let v = self.delete_services(&lp, left()).await;
        let p = call(left(), || async {
            pods.delete_collection(&DeleteParams::default(), &lp).await
        })
        .await
        .map(|_| ());
        // Wait until the pods are gone (their grace period), at most a minute.
        if p.is_ok() {
            for _ in 0..120 {
                match tokio::time::timeout(API_TIMEOUT, pods.list(&lp)).await {
                    Ok(Ok(l)) if l.items.is_empty() => break,
                    Ok(Err(e)) if !transient(&e) => break,
                    _ => tokio::time::sleep(Duration::from_millis(500)).await,
                }
            }
        }
        self.secrets_made.lock().await.retain(|r| r != run_id);
        self.files_made.lock().await.retain(|(r, _)| r != run_id);
        s.map_err(|e| e.into_kube("delete the run's secret", budget))?;
        f.map_err(|e| e.into_kube("delete the run's configmaps", budget))?;
        j.map_err(|e| e.into_kube("delete the run's jobs", budget))?;
        v.map_err(|e| e.into_kube("delete the run's services", budget))?;
        p.map_err(|e| e.into_kube("delete the run's pods", budget))?;
        Ok(())
    }
}

impl JobCell<'_> {
    /// Delete the Job (retried while the API server is away), and a
    /// multi-node cell's Service; one that stays is named in `kubernetes.log`.
    pub(super) async fn delete(&mut self) {
        if !self.deleted {
            self.deleted = true;
            if self.service_made {
                let name = spec::service_name(&self.job_name);
                if let Err(e) = self.backend.delete_service(&name).await {
                    let line = format!(
                        "orch: the service {name} could not be deleted ({e}); the garbage collector deletes it with its Job, `orch down` by label"
                    );
                    self.log(&line);
                }
            }
            if let Err(e) = self.backend.delete_job(&self.job_name).await {
                let line = format!(
                    "orch: the job {} could not be deleted ({e}); its activeDeadlineSeconds stops it, `orch down` deletes it",
                    self.job_name
                );
                self.log(&line);
            }
        }
    }
}
