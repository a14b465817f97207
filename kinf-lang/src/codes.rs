//! The catalogue of diagnostic codes. Codes are stable: never renumber, only add.
//!
//! Each code has a one-line summary here and a long explanation with a wrong and a right
//! example in `kinf-lang/explain/KINFnnnn.md` (shown by `kinfctl explain-code`, and collected
//! into `docs/diagnostics.md`).

use crate::diagnostic::Severity;

macro_rules! codes {
    ($( $variant:ident = $code:literal, $sev:ident, $summary:literal; )*) => {
        /// A stable diagnostic code.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Code {
            $(
                #[doc = $summary]
                $variant,
            )*
        }

        impl Code {
            /// Every code, in catalogue order.
            pub const ALL: &'static [Code] = &[$(Code::$variant),*];

            /// The code as written: `KINF0101`.
            pub fn as_str(self) -> &'static str {
                match self { $(Code::$variant => $code),* }
            }

            /// The default severity.
            pub fn severity(self) -> Severity {
                match self { $(Code::$variant => Severity::$sev),* }
            }

            /// One-line summary.
            pub fn summary(self) -> &'static str {
                match self { $(Code::$variant => $summary),* }
            }

            /// The long explanation (markdown) with a wrong and a right example.
            pub fn explanation(self) -> &'static str {
                match self { $(Code::$variant => include_str!(concat!("../explain/", $code, ".md"))),* }
            }
        }
    };
}

codes! {
    YamlSyntax = "KINF0001", Error, "the file is not valid YAML";
    NotAMapping = "KINF0002", Error, "a document is not a mapping";
    DuplicateKey = "KINF0003", Error, "a mapping has the same key twice";
    UnsupportedApiVersion = "KINF0004", Error, "`apiVersion` is missing or not supported";
    UnknownKind = "KINF0005", Error, "`kind` is missing or not a Kinference resource";
    MissingName = "KINF0006", Error, "`metadata.name` is missing or invalid";
    DuplicateResource = "KINF0007", Error, "two resources have the same kind, namespace and name";
    UnknownField = "KINF0101", Error, "a field that the resource does not have";
    WrongType = "KINF0102", Error, "a value of the wrong type";
    UnknownEnumValue = "KINF0103", Error, "a value that is not one of the allowed names";
    MissingField = "KINF0104", Error, "a required field is missing";
    OutOfRange = "KINF0105", Error, "a number or list length outside its allowed range";
    InvalidValue = "KINF0106", Error, "a value that does not have the required form";
    InvalidDuration = "KINF0201", Error, "a duration that does not parse";
    InvalidQuantity = "KINF0202", Error, "a quantity, ratio or threshold that does not parse";
    InvalidGlob = "KINF0203", Error, "a model-name glob that does not parse";
    ExprSyntax = "KINF0204", Error, "a `when:` expression that does not parse";
    ExprType = "KINF0205", Error, "a `when:` expression that does not type-check";
    EmptyThreshold = "KINF0206", Error, "a threshold with no bound, or bounds that can never hold";
    InvalidEndpoint = "KINF0207", Error, "an endpoint address that is not `host:port`";
    UnknownModel = "KINF0301", Error, "a model name or alias that no destination serves";
    UnknownDestination = "KINF0302", Error, "a worker set or provider name that does not resolve";
    UnknownPool = "KINF0303", Error, "a pool name that does not resolve";
    MissingRuleName = "KINF0401", Error, "a rule without a name";
    DuplicateRuleName = "KINF0402", Error, "two rules of one policy have the same name";
    MissingDrop = "KINF0403", Error, "an exclude filter without `drop`";
    AmbiguousTier = "KINF0404", Error, "a select tier with both `order` and `minimize`";
    FilterName = "KINF0405", Error, "an exclude filter without a name, or with a duplicate name";
    SelectorOrEndpoints = "KINF0406", Error, "a worker set needs exactly one of `selector` and `endpoints`";
    CredentialSource = "KINF0407", Error, "credentials or API keys need exactly one source";
    EmptyDrop = "KINF0408", Error, "a `drop` with no condition would drop every candidate";
    MeasureUnavailable = "KINF0409", Warning, "a condition on a measure that a backend type never has";
    IgnoredField = "KINF0410", Warning, "a field that is accepted but not read";
    EmptySelector = "KINF0411", Warning, "a worker-set selector that selects every pod of its namespace";
    ConstantCondition = "KINF0412", Warning, "a `when:` that never changes: a `drop` of every candidate or of none, a condition that never holds";
    IgnoredTargetGroup = "KINF0413", Warning, "a `targetRefs` group other than `kinference.buoyant.io`, which is ignored";
    NonUsdCurrency = "KINF0414", Warning, "a `cost.currency` other than `USD`: prices are not converted, costs are counted in US dollars";
    ShadowedRule = "KINF0501", Warning, "a rule that an earlier rule always matches first";
    UnknownTag = "KINF0502", Warning, "a tag that no configured classifier produces";
    UnreachableTier = "KINF0503", Warning, "a select tier that can never have a candidate";
    EmptyCandidates = "KINF0504", Warning, "a rule whose candidate set is always empty";
    UnusedPolicy = "KINF0505", Warning, "a policy that applies to no pool";
    DuplicateLimitName = "KINF0506", Error, "two limits of one policy have the same name";
    UnpricedCost = "KINF0507", Warning, "`minimize: Cost` over a destination without prices";
    OverlappingHosts = "KINF0508", Warning, "two front doors answer the same host, or both answer every host";
    UnknownWhenName = "KINF0509", Warning, "a `when:` compares a model or destination with a name the targeted pools do not have";
}

impl Code {
    /// Looks a code up by its text (`KINF0101`, case-insensitive).
    pub fn parse(s: &str) -> Option<Code> {
        Code::ALL
            .iter()
            .copied()
            .find(|c| c.as_str().eq_ignore_ascii_case(s.trim()))
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
