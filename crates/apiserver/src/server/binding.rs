//! `POST /api/v1/namespaces/{ns}/pods/{name}/binding`: how a scheduler assigns a Pod to a node.
//! As kube-apiserver, the body is a Binding whose target is a Node; the Pod gets
//! `spec.nodeName` and a `PodScheduled=True` condition; a Pod already assigned, or being
//! deleted, is a conflict; the answer is a Success Status with code 201 (after a dry run too,
//! which checks all this and assigns nothing).

use super::*;

fn binding_target(body: &Value, pod: &str) -> Result<String, ApiError> {
    if let Some(named) = body["metadata"]["name"].as_str()
        && named != pod
    {
        return Err(ApiError::bad_request(format!(
            "the name of the Binding ({named:?}) does not match the name of the pod ({pod:?})"
        )));
    }
    let kind = body["target"]["kind"].as_str().unwrap_or("Node");
    if !kind.is_empty() && kind != "Node" {
        return Err(ApiError::bad_request(format!(
            "target kind {kind:?} is not supported; only Node"
        )));
    }
    match body["target"]["name"].as_str() {
        Some(node) if !node.is_empty() => Ok(node.to_string()),
        _ => Err(ApiError::invalid(
            "Binding",
            pod,
            "target.name: Required value",
        )),
    }
}

pub(crate) async fn bind(
    app: &Shared,
    t: &Target,
    name: &str,
    body: Bytes,
    mode: WriteMode,
) -> Result<Response, ApiError> {
    let body = parse_body(&body)?;
    let node = binding_target(&body, name)?;
    let ns = t.namespace.clone().unwrap_or_default();
    let rt = t.rt.clone();
    let Written { rv, .. } = write_object(app, mode, &rt, &ns, name, |current, _| {
        let Some(current) = current else {
            return Err(ApiError::not_found(&rt.group, &rt.plural, name));
        };
        // The node is written into its spec and the condition into its status: a Pod stored
        // with either not an object (Pods are not checked field by field here) cannot be bound.
        if let Some(part) = ["spec", "status"]
            .into_iter()
            .find(|part| !(current[*part].is_object() || current[*part].is_null()))
        {
            return Err(ApiError::invalid(
                "Pod",
                name,
                &format!("{part}: Invalid value: must be an object"),
            ));
        }
        if !current["metadata"]["deletionTimestamp"].is_null() {
            return Err(ApiError::conflict(
                &rt.group,
                "pods/binding",
                name,
                "pod is being deleted, cannot be assigned to a host",
            ));
        }
        if let Some(assigned) = current["spec"]["nodeName"]
            .as_str()
            .filter(|n| !n.is_empty())
        {
            return Err(ApiError::conflict(
                &rt.group,
                "pods/binding",
                name,
                &format!("pod {name} is already assigned to node {assigned:?}"),
            ));
        }
        let mut next = current.clone();
        next["spec"]["nodeName"] = json!(node);
        let condition = json!({
            "type": "PodScheduled",
            "status": "True",
            "lastProbeTime": null,
            "lastTransitionTime": objects::now_rfc3339(),
        });
        let mut conditions: Vec<Value> = next["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|c| c["type"] != "PodScheduled")
            .collect();
        conditions.push(condition);
        next["status"]["conditions"] = json!(conditions);
        Ok(Write2::Put(next))
    })?;
    commit(app, &rt, rv).await?;
    Ok(json_response(
        StatusCode::CREATED,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_binding_names_a_node_of_the_same_pod() {
        let ok = json!({"metadata": {"name": "web"}, "target": {"kind": "Node", "name": "node-2"}});
        assert_eq!(binding_target(&ok, "web").ok(), Some("node-2".to_string()));
        let bare = json!({"target": {"name": "node-2"}});
        assert_eq!(
            binding_target(&bare, "web").ok(),
            Some("node-2".to_string())
        );
        for bad in [
            json!({"metadata": {"name": "other"}, "target": {"name": "node-2"}}),
            json!({"target": {"kind": "Pod", "name": "x"}}),
            json!({"target": {"name": ""}}),
            json!({}),
        ] {
            assert!(binding_target(&bad, "web").is_err(), "{bad}");
        }
    }
}
