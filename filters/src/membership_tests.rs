//! Tests of the admin-answer parser and the health mapping.

use super::*;

#[test]
fn a_minimal_answer_parses() {
    let body = br#"{"cluster_statuses":[{"name":"pool","host_statuses":[
        {"address":{"socket_address":{"address":"10.0.0.1","port_value":8000}},
         "health_status":{"eds_health_status":"HEALTHY"}}]}]}"#;
    assert_eq!(
        parse_admin_clusters(body),
        Ok(vec![ClusterMembers {
            cluster: "pool".to_owned(),
            members: vec![Member {
                address: "10.0.0.1:8000".to_owned(),
                health: Health::Healthy,
            }],
        }])
    );
}
