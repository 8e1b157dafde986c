//! `kube::Resource` for a typed custom resource whose struct has a `metadata: ObjectMeta` field
//! (the project's CRD types are plain serde structs, without kube's derive).

/// Implements `kube::Resource` for `$type`:
/// `custom_resource!(Type, "group", "version", "Kind", "plural", ScopeType)`.
#[macro_export]
macro_rules! custom_resource {
    ($type:ty, $group:expr, $version:expr, $kind:literal, $plural:literal, $scope:ty) => {
        impl kube::Resource for $type {
            type DynamicType = ();
            type Scope = $scope;

            fn kind(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($kind)
            }
            fn group(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($group)
            }
            fn version(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($version)
            }
            fn plural(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($plural)
            }
            fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.metadata
            }
            fn meta_mut(
                &mut self,
            ) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

/// Creates each CustomResourceDefinition of `definitions` that does not exist yet (an existing
/// one is left as it is).
pub async fn install(
    client: &kube::Client,
    definitions: impl IntoIterator<Item = serde_json::Value>,
) -> Result<(), kube::Error> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let api: kube::Api<CustomResourceDefinition> = kube::Api::all(client.clone());
    for definition in definitions {
        let crd: CustomResourceDefinition =
            serde_json::from_value(definition).map_err(kube::Error::SerdeError)?;
        match api.create(&Default::default(), &crd).await {
            Ok(_) => {}
            Err(error) if crate::api_errors::is_already_exists(&error) => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}
