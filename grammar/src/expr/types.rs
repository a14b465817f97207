//! Types of condition values and the environment a condition is checked in.

use std::fmt;

/// The type of a value in a condition.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Type {
    /// A 64-bit signed integer.
    Int,
    /// A 64-bit float; compares with `Int` numerically.
    Float,
    /// Text; supports only `==`, `!=`, `in` and `not in`.
    String,
    /// `true` or `false`.
    Bool,
    /// A length of time; compares only with `Duration`.
    Duration,
    /// A list whose elements all have the given type.
    List(Box<Type>),
}

impl Type {
    /// `List<elem>`.
    pub fn list(elem: Type) -> Type {
        Type::List(Box::new(elem))
    }

    /// Whether this is `Int` or `Float`.
    pub fn is_numeric(&self) -> bool {
        matches!(self, Type::Int | Type::Float)
    }
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Type::Int => f.write_str("Int"),
            Type::Float => f.write_str("Float"),
            Type::String => f.write_str("String"),
            Type::Bool => f.write_str("Bool"),
            Type::Duration => f.write_str("Duration"),
            Type::List(elem) => write!(f, "List<{elem}>"),
        }
    }
}

/// The signature of a function a condition may call.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FnSig {
    /// The name used in conditions.
    pub name: String,
    /// Parameter types, in order. An `Int` argument is accepted (and
    /// converted) where a `Float` is expected.
    pub params: Vec<Type>,
    /// The result type.
    pub ret: Type,
}

impl fmt::Display for FnSig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}(", self.name)?;
        for (i, param) in self.params.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{param}")?;
        }
        write!(f, ") -> {}", self.ret)
    }
}

/// The variables and functions visible to a condition, which differ by the
/// context the condition appears in.
///
/// Type checking resolves names to indices into `vars` and `funcs`; those
/// indices are what [`EvalContext`](super::EvalContext) receives at
/// evaluation time. When a name appears twice, the first entry wins.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Env {
    /// Variables: name and type.
    pub vars: Vec<(String, Type)>,
    /// Functions.
    pub funcs: Vec<FnSig>,
}

impl Env {
    /// An empty environment.
    pub fn new() -> Self {
        Self::default()
    }

    /// The environment with one more variable (builder style).
    #[must_use]
    pub fn var(mut self, name: impl Into<String>, ty: Type) -> Self {
        self.vars.push((name.into(), ty));
        self
    }

    /// The environment with one more function (builder style).
    #[must_use]
    pub fn func(
        mut self,
        name: impl Into<String>,
        params: impl IntoIterator<Item = Type>,
        ret: Type,
    ) -> Self {
        self.funcs.push(FnSig {
            name: name.into(),
            params: params.into_iter().collect(),
            ret,
        });
        self
    }

    /// Index and type of the variable `name`.
    pub fn lookup_var(&self, name: &str) -> Option<(usize, &Type)> {
        self.vars
            .iter()
            .enumerate()
            .find(|(_, (n, _))| n == name)
            .map(|(i, (_, ty))| (i, ty))
    }

    /// Index and signature of the function `name`.
    pub fn lookup_func(&self, name: &str) -> Option<(usize, &FnSig)> {
        self.funcs.iter().enumerate().find(|(_, f)| f.name == name)
    }
}
